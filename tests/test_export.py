"""zoo export: a trained GPT-NeoX loads in transformers' GPTNeoXForCausalLM with no missing or
unexpected keys and the same logits; every family round-trips through archs.save / archs.load;
zoo list, eval, generate. Every family's --to hf folder: tests/test_export_families.py."""

import json

import pytest
import torch
from click.testing import CliRunner
from test_train import config

from longpack import archs
from longpack.archs.hf.transformers_compat import import_transformers
from longpack.training.loop import train
from longpack.zoo.cli import zoo


@pytest.fixture(scope="module")
def neox_run(tmp_path_factory, shards_once):
    """A 2-step run on `shards`, trained once for the module's tests, which only read it."""
    run = tmp_path_factory.mktemp("export") / "run"
    train(config(shards_once, run, max_steps=2, save_every=2, workers=0), log=lambda m: None)
    return run


@pytest.mark.slow
def test_a_trained_gpt_neox_loads_in_transformers_with_the_same_logits(tmp_path, shards,
                                                                    neox_run):
    pytest.importorskip("transformers")
    transformers = import_transformers()
    out = tmp_path / "hf"
    result = CliRunner().invoke(zoo, ["export", str(neox_run), "--to", "hf", "--out", str(out)])
    assert result.exit_code == 0, result.output
    hf, info = transformers.GPTNeoXForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    from longpack.zoo.runs import load_run

    ours = load_run(neox_run).model
    ids = torch.randint(0, ours.cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf.eval()(ids).logits - ours(ids)).abs().max().item()
    assert diff <= 1e-4, diff
    # the build's tokenizer (a .tiktoken file here) comes along, loadable by transformers
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.decode(tok.encode("hello world")) == "hello world"
    assert tok.eos_token_id == json.loads((out / "config.json").read_text())["eos_token_id"]
    from longpack.pipeline.tokenize.tokenizer import load_tokenizer

    ref = load_tokenizer(json.loads((shards / "manifest.json").read_text())["tokenizer"]["source"])
    text = "pack it: ünïcode 123,\n\tdone"  # (a literal <|endoftext|> is text to pack build)
    ids, _ = ref.reference.encode_flat([text])
    assert tok.encode(text) == ids.tolist()
    assert tok.convert_tokens_to_ids("<|endoftext|>") == ref.eos_id


@pytest.mark.parametrize("name", ["neox-tiny", "moe-tiny", "resonance-tiny", "mamba-tiny"])
def test_every_family_round_trips_through_safetensors(tmp_path, name):
    torch.manual_seed(0)
    model = archs.build(name, vocab_size=300).eval()
    archs.save(model, tmp_path / name)
    again = archs.load(tmp_path / name)
    ids = torch.randint(0, 300, (1, 32))
    with torch.no_grad():
        assert torch.equal(model(ids), again(ids))


def test_export_refuses_what_it_cannot_write(tmp_path, neox_run):
    runner = CliRunner()
    result = runner.invoke(zoo, ["export", str(tmp_path / "nothing"), "--to", "hf", "--out",
                                 str(tmp_path / "o")])
    assert result.exit_code == 1 and "no complete checkpoint" in result.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    result = runner.invoke(zoo, ["export", str(neox_run), "--to", "hf", "--out",
                                 str(tmp_path / "full")])
    assert result.exit_code == 1 and "is not empty" in result.output
    assert (tmp_path / "full" / "x").read_text() == "mine"
    for to in ("hf", "safetensors"):  # a file where the folder would go: named, untouched
        result = runner.invoke(zoo, ["export", str(neox_run), "--to", to, "--out",
                                     str(tmp_path / "full" / "x")])
        assert result.exit_code == 1 and result.output.strip().splitlines()[-1] == (
            f"Error: --out {tmp_path / 'full' / 'x'} is not a directory: choose a new or "
            "empty directory"), result.output
        assert (tmp_path / "full" / "x").read_text() == "mine"


@pytest.mark.slow
def test_zoo_list_is_the_presets_table(tmp_path):
    result = CliRunner().invoke(zoo, ["list", "--vocab", "1000", "--json"])
    assert result.exit_code == 0
    listed = json.loads(result.output)
    assert {m["name"] for m in listed} == set(archs.PRESETS)
    assert all(m["vocab_size"] == 1000 for m in listed)


@pytest.mark.parametrize("name", ["gpt2.tiktoken", "cl100k_base.tiktoken",
                                  "gpt-neox-tokenizer.json"])
@pytest.mark.slow  # each ~4 s
def test_the_exported_tokenizer_gives_the_builds_ids(tmp_path, real_text, name):
    """The shipped tokenizers, cl100k_base's gap between its last rank and its special ids
    included."""
    pytest.importorskip("transformers")
    transformers = import_transformers()
    from longpack.archs.hf.hf_folder import write_tokenizer
    from longpack.pipeline.tokenize.tokenizer import load_tokenizer

    ref = load_tokenizer(str(real_text.tokenizer(name)))
    write_tokenizer(ref, tmp_path, 2048)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "Long-context pretraining: ünïcode, 数字 12345, emoji 🙂,\n\n\tcode() {}"
    ids, _ = ref.reference.encode_flat([text])
    assert tok.encode(text, add_special_tokens=False) == ids.tolist()
    assert tok.convert_tokens_to_ids("<|endoftext|>") == ref.eos_id


def test_zoo_eval_on_val_is_the_trainers_final_val_loss(tmp_path, shards, neox_run):
    final = json.loads((neox_run / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["val_targets"] > 0
    # the trainer evaluates the first eval_batches x batch_size val rows (4 x 4)
    result = CliRunner().invoke(zoo, ["eval", str(neox_run), "--shards", str(shards),
                                      "--batch-size", "4", "--limit", "16", "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    assert got["targets"] == final["val_targets"]
    assert abs(got["loss"] - final["val_loss"]) < 1e-6
    assert got["bits_per_byte"] is None  # a part of the split: its bytes are not known
    got = json.loads(CliRunner().invoke(zoo, ["eval", str(neox_run), "--shards", str(shards),
                                              "--json"]).output)
    manifest = json.loads((shards / "manifest.json").read_text())["splits"]["val"]
    assert got["bits_per_byte"] == pytest.approx(
        got["loss"] / 0.6931471805599453 * manifest["tokens"] / manifest["text_bytes"])
    text = CliRunner().invoke(zoo, ["eval", str(neox_run), "--shards", str(shards)]).output
    assert text.startswith(f"zoo eval: {neox_run} on {shards} val (")


@pytest.mark.parametrize("preset,args", [
    ("neox-tiny", {}),
    ("moe-tiny", {}),
    ("moe-tiny", {"n_pred_tokens": 3, "mod_capacity": 0.5, "n_layers": 4}),  # depth-routed blocks
])
def test_the_key_value_cache_gives_the_full_forwards_logits(preset, args):
    torch.manual_seed(0)
    model = archs.build(preset, vocab_size=300, **args).eval()
    if args.get("mod_capacity"):  # a predictor that chooses about half the tokens
        for block in model.blocks:
            if hasattr(block, "predictor"):
                torch.nn.init.normal_(block.predictor.weight, std=1.0)
    ids = torch.randint(0, 300, (1, 24))
    cache = model.new_cache()
    with torch.no_grad():
        full = model(ids)
        prefix = model.decode(ids[:, :10], cache)  # the prompt at once
        steps = [model.decode(ids[:, t:t + 1], cache) for t in range(10, 20)]  # one by one
        rest = model.decode(ids[:, 20:], cache)  # several after a cache
    got = torch.cat([prefix, *steps, rest], 1)
    assert (got - full).abs().max().item() < 1e-5
    if args.get("mod_capacity"):  # some tokens skipped a depth-routed block, some went through
        kept = [c["kv"]["k"].shape[2] for c, b in zip(cache, model.blocks) if hasattr(b, "router")]
        assert kept and all(0 < n < 24 for n in kept), kept


def test_capacity_bound_moe_generates_by_recomputation():
    from longpack.archs.generate import generate

    torch.manual_seed(0)
    model = archs.build("moe-tiny", vocab_size=300, capacity_factor=1.0).eval()
    assert model.new_cache() is None  # a token's expert slots depend on its document's length
    out = generate(model, [5, 6, 7], 4)
    with torch.no_grad():  # each token: the full forward over everything before it
        expect = [int(model(torch.tensor([[5, 6, 7, *out[:i]]]))[0, -1].argmax())
                  for i in range(4)]
    assert out == expect


@pytest.mark.slow
def test_greedy_generation_is_transformers_greedy_generation(tmp_path, neox_run):
    pytest.importorskip("transformers")
    transformers = import_transformers()
    from longpack.archs.generate import generate
    from longpack.zoo.runs import load_run

    out = tmp_path / "hf"
    assert CliRunner().invoke(zoo, ["export", str(neox_run), "--to", "hf", "--out",
                                    str(out)]).exit_code == 0
    hf = transformers.GPTNeoXForCausalLM.from_pretrained(out).eval()
    trained = load_run(neox_run)
    model, tokenizer = trained.model, trained.tokenizer
    prompt = tokenizer.reference.encode_flat(["the long context "])[0].tolist()
    ours = generate(model, prompt, max_new=12)  # eos_id None: 12 tokens whatever comes
    theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                         eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == theirs and len(ours) == 12


def test_zoo_generate_samples_reproducibly(neox_run):
    runner = CliRunner()
    args = ["generate", str(neox_run), "--prompt", "alpha beta", "--max-new-tokens", "20"]
    greedy = runner.invoke(zoo, args)
    assert greedy.exit_code == 0 and greedy.output.startswith("alpha beta"), greedy.output
    sampled = [runner.invoke(zoo, [*args, "--temperature", "1.0", "--top-k", "50", "--top-p",
                                   "0.9", "--seed", str(s)]).output for s in (1, 1, 2)]
    assert sampled[0] == sampled[1]  # the same seed, the same text
    from longpack.archs.generate import next_token

    logits = torch.tensor([0.0, 5.0, 4.9, -3.0])
    picks = {next_token(logits, 1.0, 2, None, torch.Generator().manual_seed(s)) for s in range(50)}
    assert picks == {1, 2}  # top-k 2: only the two most likely
    picks = {next_token(logits, 1.0, None, 0.5, torch.Generator().manual_seed(s))
             for s in range(50)}
    assert picks == {1}  # top-p 0.5: the most likely alone reaches it


def test_generation_samples_only_ids_the_tokenizer_decodes(byte_tokenizer):
    from longpack.archs.generate import generate
    from longpack.pipeline import load_tokenizer

    tokenizer = load_tokenizer(byte_tokenizer)  # 256 bytes and <|endoftext|> = 50256: holes
    allowed = torch.from_numpy(tokenizer.decodable())
    assert int(allowed.sum()) == 257 and allowed[50256] and not allowed[300]

    class Favours300:  # a model whose best token is one the tokenizer lacks
        blocks = []

        def eval(self):
            return self

        def __call__(self, ids):
            logits = torch.zeros(1, ids.shape[1], 50304)  # a vocabulary padded past the tokenizer's
            logits[..., 300], logits[..., 50300], logits[..., 65] = 9.0, 8.0, 1.0
            return logits

    assert generate(Favours300(), [1], 3) == [300, 300, 300]
    assert generate(Favours300(), [1], 3, allowed=allowed) == [65, 65, 65]
    assert tokenizer.decode([65]) == "A"


@pytest.mark.slow
@pytest.mark.parametrize("dtype, torch_dtype, name", [("bf16", torch.bfloat16, "bfloat16"),
                                                      ("fp16", torch.float16, "float16")])
def test_a_half_precision_export_holds_half_the_bytes_and_loads_as_it_says(
        tmp_path, neox_run, dtype, torch_dtype, name):
    """Exports were fp32 only: a 5B model's folder was ~20 GB."""
    from safetensors import safe_open

    transformers = import_transformers()
    full, half = tmp_path / "fp32", tmp_path / dtype
    for out, more in ((full, []), (half, ["--dtype", dtype])):
        r = CliRunner().invoke(zoo, ["export", str(neox_run), "--to", "hf", "--out", str(out),
                                     *more])
        assert r.exit_code == 0, r.output
    assert json.loads((half / "config.json").read_text())["torch_dtype"] == name
    with safe_open(str(half / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch_dtype}
    size = {p: (p / "model.safetensors").stat().st_size for p in (full, half)}
    assert size[half] < 0.55 * size[full]
    hf = transformers.AutoModelForCausalLM.from_pretrained(half, torch_dtype="auto")
    ref = transformers.AutoModelForCausalLM.from_pretrained(full)
    assert hf.dtype == torch_dtype and ref.dtype == torch.float32
    ids = torch.randint(0, ref.config.vocab_size, (1, 32),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = ref.eval()(ids).logits, hf.eval()(ids).logits.float()
    assert (got - want).abs().max() <= 0.05 * want.abs().max()  # rounded weights, same model
    r = CliRunner().invoke(zoo, ["export", str(neox_run), "--to", "safetensors", "--out",
                                 str(tmp_path / "st"), "--dtype", dtype])
    assert r.exit_code == 1 and "--dtype are --to hf's" in r.output
    assert not (tmp_path / "st").exists()


def _moved_build(monkeypatch, keep_copy: bool):
    """The run's build as zoo would find it after `cd elsewhere`: its manifest's source is the
    relative path a user typed (not here); the build's copy of the tokenizer is kept or not."""
    import longpack.zoo.runs as runs

    real = runs._build

    def moved(shards):
        folder, manifest = real(shards)
        tok = {**manifest["tokenizer"], "source": "../shared/tokenizers/bytes-tokenizer.json"}
        if not keep_copy:
            tok.pop("file")
        return folder, {**manifest, "tokenizer": tok}

    monkeypatch.setattr(runs, "_build", moved)


@pytest.mark.slow
def test_an_export_from_another_folder_takes_the_builds_copy(tmp_path, monkeypatch, neox_run):
    pytest.importorskip("transformers")
    _moved_build(monkeypatch, keep_copy=True)
    out = tmp_path / "hf"
    result = CliRunner().invoke(zoo, ["export", str(neox_run), "--to", "hf", "--out", str(out)])
    assert result.exit_code == 0 and "note" not in result.output, result.output
    assert (out / "tokenizer.json").is_file()


@pytest.mark.slow
def test_an_export_without_its_tokenizer_is_an_error_unless_asked_for(tmp_path, monkeypatch,
                                                                      neox_run):
    pytest.importorskip("transformers")
    _moved_build(monkeypatch, keep_copy=False)
    runner = CliRunner()
    result = runner.invoke(zoo, ["export", str(neox_run), "--to", "hf", "--out",
                                 str(tmp_path / "hf")])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith(f"Error: {neox_run}: no tokenizer to export with the model: ")
    assert "keeps no copy of its tokenizer" in lines[0]
    assert "../shared/tokenizers/bytes-tokenizer.json" in lines[0]
    assert "--no-tokenizer" in lines[0] and not (tmp_path / "hf").exists()
    result = runner.invoke(zoo, ["export", str(neox_run), "--to", "hf", "--out",
                                 str(tmp_path / "hf"), "--no-tokenizer"])
    assert result.exit_code == 0 and "note: no tokenizer written" in result.output
    assert not (tmp_path / "hf" / "tokenizer.json").exists()
    assert (tmp_path / "hf" / "config.json").is_file()
    result = runner.invoke(zoo, ["export", str(neox_run), "--to", "safetensors", "--out",
                                 str(tmp_path / "st"), "--no-tokenizer"])
    assert result.exit_code == 1 and "--no-tokenizer and --shards are --to hf's" in result.output
    result = runner.invoke(zoo, ["export", str(neox_run), "--to", "safetensors", "--out",
                                 str(tmp_path / "st"), "--shards", str(tmp_path)])
    assert result.exit_code == 1 and "--no-tokenizer and --shards are --to hf's" in result.output
    result = runner.invoke(zoo, ["generate", str(neox_run), "--prompt", "hi"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "no tokenizer to encode the prompt with" in lines[0]
    assert "keeps no copy of its tokenizer" in lines[0]
