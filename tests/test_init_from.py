"""train --init-from SOURCE (training/init_from.py, archs/hf/hf_import.py): a run starts from
a run's checkpoint, or a transformers folder, with the source's weights (the same val loss
and logits), a new optimizer and step 0, and records where it began; a resume never reads
SOURCE again. Every hostile SOURCE is one line before anything is written: a missing folder,
another family, another vocabulary, other shapes or settings, a pickle in place of weights
(nothing of it runs), --init-from beside a run that has checkpoints of its own. Context
extension: a neox trained on 256-token rows continues on 2,048 with a larger rotary base,
which its export says as transformers reads it. A GPTNeoXForCausalLM made by transformers, in
a process without longpack, starts a run with transformers' logits and exports back to them.
"""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from test_train import config

from conftest import WITHOUT_LONGPACK, small_build, write_byte_tokenizer_json
from longpack import TrainingError, archs
from longpack.archs.hf.native import hf_state_dict
from longpack.training.checkpoints import checkpoint
from longpack.training.cli import train as train_cli
from longpack.training.init_from import begin
from longpack.training.loop import train


class Planted:
    """Unpickled, it would create the file at `path` (what a malicious file does)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def neox_folder(folder: Path, model, tokenizer: Path | None = None, **changes) -> Path:
    """A GPTNeoXForCausalLM folder of an archs GPT-NeoX, as transformers saves one (config.json,
    model.safetensors under its names), written without transformers; `changes` to config.json."""
    from safetensors.torch import save_file

    c = model.cfg
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
        "vocab_size": c.vocab_size, "hidden_size": c.d_model, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff, "hidden_act": "gelu",
        "rotary_pct": c.rotary_pct, "rotary_emb_base": c.rotary_base,
        "max_position_embeddings": c.max_seq, "layer_norm_eps": c.norm_eps,
        "use_parallel_residual": True, "tie_word_embeddings": False, "attention_bias": True,
        **changes}))
    save_file(hf_state_dict(model), str(folder / "model.safetensors"))
    if tokenizer is not None:
        (folder / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    return folder


def byte_tokenizer_of(build: Path) -> Path:
    return build / json.loads((build / "manifest.json").read_text())["tokenizer"]["file"]


def refused(args: list[str], run: Path) -> str:
    """`train ARGS --out RUN`'s one error line; RUN as it was (not made)."""
    existed = run.exists()
    before = sorted(p.relative_to(run) for p in run.rglob("*")) if existed else None
    result = CliRunner().invoke(train_cli, [*args, "--out", str(run), "--workers", "0"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.strip().splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.output
    assert run.exists() == existed
    if existed:
        assert sorted(p.relative_to(run) for p in run.rglob("*")) == before
    return lines[0]


# -- hostile sources: one line each, before the data is opened (quick) ----------------------

def test_a_missing_folder_a_file_and_nanogpts_words_are_one_line(tmp_path, shards_once):
    base = ["--shards", str(shards_once)]
    line = refused([*base, "--init-from", str(tmp_path / "nowhere")], tmp_path / "run")
    assert "no such folder" in line and "transformers model folder" in line
    line = refused([*base, "--init-from", "resume"], tmp_path / "run")
    assert "nanoGPT's init_from" in line and "--resume auto" in line
    (tmp_path / "weights.safetensors").write_bytes(b"x")
    line = refused([*base, "--init-from", str(tmp_path / "weights.safetensors")],
                   tmp_path / "run")
    assert "a file" in line and "config.json" in line
    (tmp_path / "empty").mkdir()
    line = refused([*base, "--init-from", str(tmp_path / "empty")], tmp_path / "run")
    assert "neither a longpack run or checkpoint" in line


def test_pickles_in_place_of_weights_are_refused_and_never_run(tmp_path, shards_once):
    torch.manual_seed(0)
    model = archs.build("neox-tiny", vocab_size=257)
    folder = neox_folder(tmp_path / "hf", model, byte_tokenizer_of(shards_once))
    planted = tmp_path / "planted"
    # a pickle named model.safetensors: the safetensors reader parses a header, nothing else
    (folder / "model.safetensors").write_bytes(pickle.dumps({"w": Planted(planted)}))
    line = refused(["--shards", str(shards_once), "--init-from", str(folder)], tmp_path / "run")
    assert "model.safetensors is not a safetensors file" in line and "nothing in it was run" \
        in line, line
    # weights only as pytorch_model.bin: refused without being opened
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"w": Planted(planted)}))
    line = refused(["--shards", str(shards_once), "--init-from", str(folder)], tmp_path / "run")
    assert "pytorch_model.bin, a pickle, which is never read" in line, line
    assert not planted.exists()


def test_other_shapes_settings_families_and_vocabularies_are_named(tmp_path, shards_once):
    base = ["--shards", str(shards_once)]
    tok = byte_tokenizer_of(shards_once)
    torch.manual_seed(0)
    wide = neox_folder(tmp_path / "wide", archs.build("neox-tiny", vocab_size=257, d_ff=128),
                       tok)
    line = refused([*base, "--init-from", str(wide)], tmp_path / "run")
    assert "blocks.0.fc_in.weight is [128, 64] in it and [256, 64] here (and 5 more)" in line \
        and "(its d_ff 128; this run's 256)" in line and "--model-arg d_ff=128" in line, line
    # the same shapes, another computation: 8 heads of 8 where the run has 4 of 16
    heads = neox_folder(tmp_path / "heads", archs.build("neox-tiny", vocab_size=257,
                                                        n_heads=8), tok)
    line = refused([*base, "--init-from", str(heads)], tmp_path / "run")
    assert "the same tensors" in line and "computes otherwise" in line and \
        "--model-arg n_heads=8" in line, line
    # a tensor config.json does not account for, and one renamed away
    from safetensors.torch import load_file, save_file

    odd = neox_folder(tmp_path / "odd", archs.build("neox-tiny", vocab_size=257), tok)
    weights = load_file(odd / "model.safetensors")
    weights["gpt_neox.layers.1.mlp.extra.weight"] = weights.pop(
        "gpt_neox.layers.1.mlp.dense_4h_to_h.weight")
    save_file(weights, str(odd / "model.safetensors"))
    line = refused([*base, "--init-from", str(odd)], tmp_path / "run")
    assert "it has no blocks.1.fc_out.weight" in line and \
        "gpt_neox.layers.1.mlp.extra.weight has no place here" in line, line
    # another family
    line = refused([*base, "--init-from", str(wide), "--model", "mamba-tiny"], tmp_path / "run")
    assert "it holds a gpt-neox model (GPTNeoXForCausalLM)" in line and "mamba" in line, line
    # what archs' GPT-NeoX does not compute
    sequential = neox_folder(tmp_path / "seq", archs.build("neox-tiny", vocab_size=257), tok,
                             use_parallel_residual=False)
    line = refused([*base, "--init-from", str(sequential)], tmp_path / "run")
    assert "use_parallel_residual false" in line and "parallel residual" in line, line
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama",
                                                   "architectures": ["LlamaForCausalLM"]}))
    (llama / "model.safetensors").write_bytes((wide / "model.safetensors").read_bytes())
    line = refused([*base, "--init-from", str(llama)], tmp_path / "run")
    assert "LlamaForCausalLM, which longpack does not start from" in line, line


def test_the_vocabulary_is_the_builds_or_it_is_named(tmp_path, shards_once):
    base = ["--shards", str(shards_once)]
    torch.manual_seed(0)
    model = archs.build("neox-tiny", vocab_size=257)
    bare = neox_folder(tmp_path / "bare", model)
    line = refused([*base, "--init-from", str(bare)], tmp_path / "run")
    assert "holds no tokenizer.json" in line, line
    # two tokens swapped: another tokenizer with a vocabulary of the same size
    data = json.loads(byte_tokenizer_of(shards_once).read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[97:99]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (tmp_path / "swapped.json").write_text(json.dumps(data))
    other = neox_folder(tmp_path / "other", model, tmp_path / "swapped.json")
    line = refused([*base, "--init-from", str(other)], tmp_path / "run")
    assert "id 97 is 'b' in its tokenizer.json and 'a' in the build's" in line, line
    # too few rows for the build's ids
    small = neox_folder(tmp_path / "small", archs.build("neox-tiny", vocab_size=200),
                        byte_tokenizer_of(shards_once))
    line = refused([*base, "--init-from", str(small)], tmp_path / "run")
    assert "its embedding has 200 rows" in line and "ids up to 256" in line, line


def test_a_reformatted_tokenizer_and_a_larger_vocabulary_are_accepted_and_said(
        tmp_path, shards_once):
    """The build's ids meaning the same in a tokenizer.json of other bytes with more ids, and
    an embedding past them (Pythia's): the model is built at the weights' vocabulary."""
    data = json.loads(byte_tokenizer_of(shards_once).read_text())
    data["added_tokens"].append({"id": 257, "content": "<|pad|>", "single_word": False,
                                 "lstrip": False, "rstrip": False, "normalized": False,
                                 "special": True})
    (tmp_path / "more.json").write_text(json.dumps(data, indent=1))
    torch.manual_seed(0)
    folder = neox_folder(tmp_path / "hf", archs.build("neox-tiny", vocab_size=264),
                         tmp_path / "more.json")
    said = []
    start = begin(config(shards_once, tmp_path / "run", init_from=str(folder)), None,
                  said.append)
    assert start.vocab_size == 264
    assert "another file than the build's" in said[0] and "same token at each of the " \
        "build's 257 ids" in said[0], said
    assert start.record["kind"] == "GPTNeoXForCausalLM" and start.record["name"] == "hf"
    assert start.record["source"] == str(folder.absolute())


@pytest.mark.slow
def test_a_tiktoken_build_is_held_to_a_folders_tokenizer_json(tmp_path, gpt2_vocab_shards_once):
    """A build of tiktoken ranks against an export's tokenizer.json (its ranks as transformers
    converts them): the same tokens at every id, another file."""
    from longpack.archs.hf.hf_folder import converted_tiktoken
    from longpack.pipeline.tokenize.kept import load_build_tokenizer

    build = gpt2_vocab_shards_once
    recorded = json.loads((build / "manifest.json").read_text())["tokenizer"]
    tokenizer, _ = load_build_tokenizer(recorded, build)
    (tmp_path / "converted.json").write_text(converted_tiktoken(tokenizer))
    torch.manual_seed(0)
    folder = neox_folder(tmp_path / "hf", archs.build("neox-tiny", vocab_size=50257),
                         tmp_path / "converted.json")
    said = []
    begin(config(build, tmp_path / "run", init_from=str(folder)), None, said.append)
    assert "same token at each of the build's 50,257 ids" in said[0], said


def test_a_gpt_neox_folder_loads_to_the_same_logits(tmp_path, shards_once):
    """hf_export's mapping read backwards: the folder's model is the model it came from."""
    torch.manual_seed(0)
    model = archs.build("neox-tiny", vocab_size=257).eval()
    folder = neox_folder(tmp_path / "hf", model, byte_tokenizer_of(shards_once))
    start = begin(config(shards_once, tmp_path / "run", init_from=str(folder)), None,
                  lambda line: None)
    again = archs.build("neox-tiny", vocab_size=257)
    start.load_into(again)
    ids = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(ids), again.eval()(ids))


# -- a run's checkpoint --------------------------------------------------------------------

@pytest.fixture(scope="module")
def source_run(tmp_path_factory, shards_once) -> Path:
    """neox-tiny trained 4 steps on `shards` (evaluated at its end): read only."""
    run = tmp_path_factory.mktemp("init") / "source"
    train(config(shards_once, run, max_steps=4, save_every=4, workers=0), log=lambda m: None)
    return run


def still(shards, out, source, **kw):
    """A run from `source` whose one step leaves its weights as they were (lr 1e-30: each
    update is far below a float32 weight's last bit), evaluated after it."""
    return config(shards, out, init_from=str(source), max_steps=1, lr=1e-30, min_lr=0, warmup=0,
                  save_every=1, eval_every=1, workers=0, **kw)


@pytest.mark.slow
def test_a_run_starts_from_a_runs_checkpoint_and_records_it(tmp_path, shards_once, source_run):
    said = []
    history = train(still(shards_once, tmp_path / "new", source_run), log=said.append)
    assert any(line.startswith(f"starting from {source_run} (longpack checkpoint, step 4)")
               for line in said), said
    # the source's weights: its val loss on the same val rows, its weights to the bit
    last = [json.loads(line) for line in (source_run / "metrics.jsonl").read_text().splitlines()]
    assert history[0]["step"] == 0 and history[0]["val_loss"] == last[-1]["val_loss"]
    theirs = checkpoint.model_state(checkpoint.load_latest(source_run))
    ours = checkpoint.model_state(checkpoint.load_latest(tmp_path / "new"))
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)
    state = checkpoint.load_latest(tmp_path / "new")[0]
    assert state["step"] == 1 and state["config"]["init_from"] == str(source_run)
    began = state["began_from"]
    assert began["kind"] == "longpack checkpoint" and began["step"] == 4
    first = json.loads((tmp_path / "new" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0 and first["began_from"] == began  # the local record says it too
    assert began["name"] == "source/step-00000004" and "the one it trained with" in \
        began["tokenizer"]
    # the model card says it, by name only; the command names the folder
    from longpack.zoo.model_card import model_card
    from longpack.zoo.runs import load_run

    card = model_card(load_run(tmp_path / "new"), "x", "other", 256, [])
    assert "| started from | `source/step-00000004` (longpack checkpoint, step 4;" in card
    assert "--init-from source" in card and str(source_run) not in card
    # a resume of it: its own checkpoint, the source not read again (it is gone)
    moved = tmp_path / "moved"
    os.rename(source_run, moved)
    try:
        said = []
        history = train(config(shards_once, tmp_path / "new", init_from=str(source_run),
                               max_steps=2, lr=1e-30, min_lr=0, warmup=0, save_every=1,
                               workers=0), log=said.append)
        assert any("the run began from it and resumes its own checkpoint step-00000001" in
                   line for line in said), said
        assert [r["step"] for r in history] == [0, 1]
        # a resume without --init-from (as TRAIN.md says it needs none), then the first
        # command again: the run still began from the source, whatever its last leg was given
        train(config(shards_once, tmp_path / "new", max_steps=3, lr=1e-30, min_lr=0, warmup=0,
                     save_every=1, workers=0), log=lambda m: None)
        said = []
        train(config(shards_once, tmp_path / "new", init_from=str(source_run), max_steps=4,
                     lr=1e-30, min_lr=0, warmup=0, save_every=1, workers=0), log=said.append)
        assert any("resumes its own checkpoint step-00000003" in line for line in said), said
    finally:
        os.rename(moved, source_run)
    assert checkpoint.load_latest(tmp_path / "new")[0]["began_from"] == began


@pytest.mark.slow
def test_fsdp_runs_start_from_and_become_sources(tmp_path, shards_once, source_run):
    """An --fsdp run (a process group of one) that starts from a run's checkpoint, and one
    that starts from its checkpoint (each process's part in DCP): the weights go in whole,
    before the model is sharded."""
    sharded = tmp_path / "sharded"
    train(still(shards_once, sharded, source_run, fsdp=True), log=lambda m: None)
    train(still(shards_once, tmp_path / "again", sharded, fsdp=True), log=lambda m: None)
    theirs = checkpoint.model_state(checkpoint.load_latest(source_run))
    for run in (sharded, tmp_path / "again"):
        ours = checkpoint.model_state(checkpoint.load_latest(run))
        assert all(torch.equal(theirs[k], ours[k]) for k in theirs), run


@pytest.mark.slow
def test_two_processes_start_from_it_with_ddp_and_fsdp(tmp_path, shards_once, source_run):
    """Under torchrun every process reads SOURCE (the same weights on each before DDP's
    broadcast, or whole before FSDP shards them); a refusal is every process's one line."""
    from conftest import run_train_jobs

    common = {"shards": [str(shards_once)], "init_from": str(source_run), "max_steps": 1,
              "lr": 1e-30, "min_lr": 0, "warmup": 0, "save_every": 1, "batch_size": 2,
              "workers": 0}
    run_train_jobs(tmp_path, [
        {"config": {**common, "out": str(tmp_path / "ddp")}},
        {"config": {**common, "out": str(tmp_path / "fsdp"), "fsdp": True}},
        {"argv": ["--shards", str(shards_once), "--out", str(tmp_path / "no"), "--init-from",
                  str(tmp_path / "nowhere")], "stdout": str(tmp_path / "refused")}])
    theirs = checkpoint.model_state(checkpoint.load_latest(source_run))
    for run in ("ddp", "fsdp"):
        ours = checkpoint.model_state(checkpoint.load_latest(tmp_path / run))
        assert all(torch.equal(theirs[k], ours[k]) for k in theirs), run
    for rank in (0, 1):
        printed = (tmp_path / f"refused.rank{rank}").read_text()
        assert printed.startswith("Error: --init-from") and "no such folder" in printed
    assert not (tmp_path / "no").exists()


@pytest.mark.slow
def test_init_from_beside_a_run_with_checkpoints_is_refused(tmp_path, shards, source_run):
    run = tmp_path / "run"
    train(config(shards, run, max_steps=1, save_every=1, workers=0), log=lambda m: None)
    line = refused(["--shards", str(shards), "--init-from", str(source_run)], run)
    assert "the run has a checkpoint to resume" in line and "began from random weights" in \
        line and "--resume never" in line, line
    # --resume never: the run starts anew from the source
    result = CliRunner().invoke(train_cli, ["--shards", str(shards), "--init-from",
                                            str(source_run), "--out", str(run), "--resume",
                                            "never", "--max-steps", "1", "--workers", "0"])
    assert result.exit_code == 0, result.output
    assert checkpoint.load_latest(run)[0]["began_from"]["step"] == 4


@pytest.mark.slow
def test_hostile_checkpoints_are_one_line(tmp_path, shards, source_run, byte_tokenizer):
    import shutil

    from test_checkpoint_safety import seal

    # another vocabulary: a build of the 257 bytes with two ids swapped
    data = json.loads(byte_tokenizer_of(shards).read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[97:99]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (tmp_path / "swapped.json").write_text(json.dumps(data))
    other = small_build(tmp_path, tmp_path / "swapped.json", "other", 40, seed=1)
    line = refused(["--shards", str(other), "--init-from", str(source_run)], tmp_path / "run")
    assert "is a build of swapped" in line and "the run trained with" in line, line
    # a crafted state.pt, its COMPLETE remade to match: refused, never run
    copy = Path(shutil.copytree(source_run, tmp_path / "copy"))
    planted = tmp_path / "planted"
    (copy / "step-00000004" / "state.pt").write_bytes(pickle.dumps({"x": Planted(planted)}, 2))
    seal(copy / "step-00000004")
    line = refused(["--shards", str(shards), "--init-from", str(copy / "step-00000004")],
                   tmp_path / "run")
    assert "holds more than a checkpoint's data" in line and "nothing in it was run" in line
    assert not planted.exists()
    # the run's folder: its only checkpoint unreadable
    line = refused(["--shards", str(shards), "--init-from", str(copy)], tmp_path / "run")
    assert "none of its checkpoints can be read" in line, line
    assert not planted.exists()
    # a crafted DCP .metadata (the weights' index), its COMPLETE remade: refused, never run
    copy = Path(shutil.copytree(source_run, tmp_path / "copy2"))
    (copy / "step-00000004" / ".metadata").write_bytes(pickle.dumps(Planted(planted), 2))
    seal(copy / "step-00000004")
    line = refused(["--shards", str(shards), "--init-from", str(copy / "step-00000004")],
                   tmp_path / "run")
    assert line.startswith("Error: --init-from") and "is not a DCP metadata file" in line, line
    assert not planted.exists()


# -- context extension ----------------------------------------------------------------------

@pytest.mark.slow
def test_context_extension_runs_and_exports_its_rotary_base(tmp_path):
    from longpack.archs.hf.transformers_compat import import_transformers
    from longpack.zoo.cli import zoo
    from longpack.zoo.runs import load_run

    transformers = import_transformers()
    tok = write_byte_tokenizer_json(tmp_path / "bytes.json")
    short = small_build(tmp_path, tok, "short", 60, seed=0, seq=257)
    long = small_build(tmp_path, tok, "long", 60, seed=1, seq=2049)
    train(config(short, tmp_path / "2k", max_steps=2, save_every=2, batch_size=2, workers=0),
          log=lambda m: None)
    args = ("rotary_base=500000", "max_seq=2048")
    train(config(long, tmp_path / "32k", init_from=str(tmp_path / "2k"), model_args=args,
                 max_steps=1, save_every=1, batch_size=1, workers=0), log=lambda m: None)
    state = checkpoint.load_latest(tmp_path / "32k")[0]
    assert state["model_config"]["rotary_base"] == 500000 and state["seq"] == 2049
    out = tmp_path / "hf"
    result = CliRunner().invoke(zoo, ["export", str(tmp_path / "32k"), "--to", "hf", "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "config.json").read_text())
    assert saved["rotary_emb_base"] == saved["rope_theta"] == 500000
    assert saved["max_position_embeddings"] == 2049
    hf = transformers.GPTNeoXForCausalLM.from_pretrained(out).eval()
    assert hf.config.rope_theta == 500000
    ours = load_run(tmp_path / "32k").model
    ids = torch.randint(0, 257, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids)).abs().max().item() <= 1e-4


# -- a GPTNeoXForCausalLM made by transformers ----------------------------------------------

CHILD = WITHOUT_LONGPACK + r'''
import json
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

job = json.load(open(sys.argv[1]))
ids = torch.tensor(job["ids"])
if job["make"] == "gpt-neox":
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=257, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=256, rotary_pct=0.25, max_position_embeddings=256,
        rotary_emb_base=10000, eos_token_id=256, bos_token_id=256)).eval()
    model.save_pretrained(job["folder"])
elif job["make"] in ("mamba", "mamba-tied"):
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(0)
    model = Mamba2ForCausalLM(Mamba2Config(  # a head of its own: transformers' default
        vocab_size=257, hidden_size=64, num_hidden_layers=2, state_size=16, expand=2,
        head_dim=16, num_heads=8, n_groups=1, conv_kernel=4, chunk_size=16,
        eos_token_id=256, bos_token_id=256, pad_token_id=256))
    if job["make"] == "mamba-tied":  # a head equal to the embedding, as zoo export writes one
        with torch.no_grad():  # (transformers cannot save a Mamba2's tied pair)
            model.lm_head.weight.copy_(model.backbone.embeddings.weight)
    model.eval().save_pretrained(job["folder"])
else:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(job["folder"]).eval()
with torch.no_grad():
    torch.save(model(ids).logits, job["logits"])
'''


def transformers_child(tmp: Path, folder: Path, make: str | None, ids: list) -> torch.Tensor:
    logits = tmp / f"logits-{folder.name}.pt"
    (tmp / "job.json").write_text(json.dumps({"folder": str(folder), "make": make, "ids": ids,
                                              "logits": str(logits)}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp / "job.json")], cwd=tmp,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(logits)


@pytest.mark.slow
@pytest.mark.parametrize("made,preset,cls,args", [
    ("gpt-neox", "neox-tiny", "GPTNeoXForCausalLM", ()),
    ("mamba", "mamba-tiny", "Mamba2ForCausalLM", ("tie_embeddings=false",)),
    ("mamba-tied", "mamba-tiny", "Mamba2ForCausalLM", ())])
def test_a_transformers_model_starts_a_run_and_exports_back(tmp_path, shards_once, made,
                                                            preset, cls, args):
    """A transformers folder trained 0 steps: step 0's logits are transformers', and so are
    its export's. A Mamba2ForCausalLM as transformers makes it has a head of its own: the run
    is told the one --model-arg that holds it; one whose head is its embedding starts a tied
    preset."""
    from longpack.zoo.cli import zoo
    from longpack.zoo.runs import load_run

    pytest.importorskip("transformers")
    ids = torch.randint(0, 257, (2, 48), generator=torch.Generator().manual_seed(0)).tolist()
    folder = tmp_path / "made"
    theirs = transformers_child(tmp_path, folder, made, ids)
    (folder / "tokenizer.json").write_bytes(byte_tokenizer_of(shards_once).read_bytes())
    if args:
        line = refused(["--shards", str(shards_once), "--model", preset, "--init-from",
                        str(folder)], tmp_path / "run")
        assert "computes otherwise (its tie_embeddings false; this run's true); pass " \
               "--model-arg tie_embeddings=false" in line, line
    said = []  # --max-steps 0: the run is the folder's weights, saved as step 0
    history = train(config(shards_once, tmp_path / "run", init_from=str(folder), model=preset,
                           model_args=args, max_steps=0, workers=0), log=said.append)
    assert list(history) == [] and (tmp_path / "run" / "step-00000000").is_dir()
    assert f"--max-steps 0: no step trained; the starting weights saved as step 0 (from " \
           f"{folder})" in said, said
    trained = load_run(tmp_path / "run")
    with torch.no_grad():
        assert (trained.model(torch.tensor(ids)) - theirs).abs().max().item() <= 1e-5
    assert trained.began_from["kind"] == cls
    out = tmp_path / "out"
    result = CliRunner().invoke(zoo, ["export", str(tmp_path / "run"), "--to", "hf", "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["architectures"] == [cls]
    again = transformers_child(tmp_path, out, None, ids)
    assert (again - theirs).abs().max().item() <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("preset, args", [
    ("neox-tiny", ()), ("mamba-tiny", ()), ("mamba-tiny", ("tie_embeddings=false",)),
    ("moe-tiny", ()), ("hybrid-tiny", ()), ("resonance-tiny", ()),
    ("resonance-tiny", ("tie_embeddings=true",))])
def test_every_familys_export_starts_a_run_with_its_logits(tmp_path, shards_once, preset, args):
    """zoo export's folders back in (their weights in shards): GPT-NeoX and Mamba under
    transformers' names, MoE, a hybrid and resonance under LongpackForCausalLM's, and --to
    safetensors' folder; a run of 0 steps from the export exports to transformers' logits. A
    head tied or not, as the family's tie_embeddings says, either way."""
    from longpack.pipeline.tokenize.kept import load_build_tokenizer
    from longpack.zoo.hf_export import export_hf
    from longpack.zoo.runs import TrainedRun

    manifest = json.loads((shards_once / "manifest.json").read_text())["tokenizer"]
    tokenizer, _ = load_build_tokenizer(manifest, shards_once)
    torch.manual_seed(0)
    model = archs.build(preset, vocab_size=257, **archs.parse_args(preset, list(args))).eval()
    ids = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids)
    export_hf(TrainedRun(model, tokenizer, manifest, 65, tmp_path / "run"), tmp_path / "hf",
              max_shard_size="100KB")  # several files and their index
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    archs.save(model, tmp_path / "st")
    (tmp_path / "st" / "tokenizer.json").write_bytes(byte_tokenizer_of(shards_once).read_bytes())
    for folder in (tmp_path / "hf", tmp_path / "st"):
        start = begin(config(shards_once, tmp_path / "new", model=preset, model_args=args,
                             init_from=str(folder)), None, lambda line: None)
        torch.manual_seed(1)
        again = archs.build(preset, vocab_size=start.vocab_size,
                            **archs.parse_args(preset, list(args)))
        start.load_into(again)
        with torch.no_grad():
            assert torch.equal(again.eval()(ids), want), folder
    # the whole way: a run of 0 steps from the export, exported again, loaded by transformers
    import transformers

    from longpack.zoo.cli import zoo

    train(config(shards_once, tmp_path / "run0", model=preset, model_args=args,
                 init_from=str(tmp_path / "hf"), max_steps=0, workers=0), log=lambda m: None)
    result = CliRunner().invoke(zoo, ["export", str(tmp_path / "run0"), "--to", "hf", "--out",
                                      str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out",
                                                               trust_remote_code=True).eval()
    with torch.no_grad():
        assert (loaded(ids).logits - want).abs().max().item() <= 1e-5


def test_a_config_file_and_python_take_it_as_the_flag(tmp_path, shards_once):
    """init_from in a config file (nanoGPT's key of another meaning: ours wins, and its words
    are named) and longpack.train's keyword."""
    import longpack

    (tmp_path / "run.toml").write_text(f'shards = "{shards_once}"\ninit_from = "resume"\n')
    line = refused(["--config", str(tmp_path / "run.toml")], tmp_path / "run")
    assert "--init-from resume: no such folder (nanoGPT's init_from" in line, line
    with pytest.raises(TrainingError, match="--init-from .*nowhere: no such folder"):
        longpack.train(shards=str(shards_once), out=str(tmp_path / "run"),
                       init_from=str(tmp_path / "nowhere"), log=lambda m: None)
    # a good SOURCE both ways (a --to safetensors folder): the run begins from it
    torch.manual_seed(0)
    archs.save(archs.build("neox-tiny", vocab_size=257), tmp_path / "st")
    (tmp_path / "st" / "tokenizer.json").write_bytes(byte_tokenizer_of(shards_once).read_bytes())
    (tmp_path / "ok.toml").write_text(f'shards = "{shards_once}"\ninit_from = "'
                                      f'{tmp_path / "st"}"\nmax_steps = 0\nworkers = 0\n')
    result = CliRunner().invoke(train_cli, ["--config", str(tmp_path / "ok.toml"), "--out",
                                            str(tmp_path / "from-file")])
    assert result.exit_code == 0, result.output
    longpack.train(shards=str(shards_once), out=str(tmp_path / "from-python"), max_steps=0,
                   workers=0, init_from=str(tmp_path / "st"), log=lambda m: None)
    for run in ("from-file", "from-python"):
        state = checkpoint.load_latest(tmp_path / run)[0]
        assert state["began_from"]["source"] == str(tmp_path / "st"), run
    assert not (tmp_path / "run").exists()


def test_wandbs_run_config_says_where_the_run_began(tmp_path, shards_once):
    from types import SimpleNamespace

    from longpack.training.loop import resolved_config

    tok = json.loads((shards_once / "manifest.json").read_text())["tokenizer"]
    began = {"source": "/x/hf", "name": "hf", "kind": "GPTNeoXForCausalLM"}
    cfg = config(shards_once, tmp_path / "run", init_from="hf")
    record = resolved_config(cfg, archs.build("neox-tiny", vocab_size=257),
                             SimpleNamespace(seq=65, manifest={"tokenizer": tok}), 1,
                             SimpleNamespace(global_batch=4), 4 * 64, began)
    assert record["began_from"] == began and record["init_from"] == os.path.abspath("hf")


def test_begin_is_nothing_without_init_from(tmp_path, shards_once):
    assert begin(config(shards_once, tmp_path / "run"), None, print) is None


@pytest.mark.slow
def test_sources_in_a_bucket_are_copied_once_and_read_as_here(tmp_path, shards_once,
                                                              source_run, s3, monkeypatch):
    from longpack.core.store import Store

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    run_url = s3.upload_tree(source_run, "runs/source")
    train(still(shards_once, tmp_path / "a", run_url), log=lambda m: None)
    theirs = checkpoint.model_state(checkpoint.load_latest(source_run))
    ours = checkpoint.model_state(checkpoint.load_latest(tmp_path / "a"))
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)
    began = checkpoint.load_latest(tmp_path / "a")[0]["began_from"]
    assert began["source"] == run_url and began["name"] == "source/step-00000004"
    # a checkpoint's URL, and a model folder's
    start = begin(config(shards_once, tmp_path / "b", init_from=f"{run_url}/step-00000004"),
                  None, lambda line: None)
    assert start.source.step == 4
    torch.manual_seed(0)
    model = archs.build("neox-tiny", vocab_size=257).eval()
    hf_url = s3.upload_tree(neox_folder(tmp_path / "hf", model, byte_tokenizer_of(shards_once)),
                            "models/hf")
    start = begin(config(shards_once, tmp_path / "b", init_from=hf_url), None, lambda m: None)
    again = archs.build("neox-tiny", vocab_size=257)
    start.load_into(again)
    ids = torch.randint(0, 257, (1, 30))
    with torch.no_grad():
        assert torch.equal(again.eval()(ids), model(ids))
    # the copy is used again while the bucket's objects are the same; a replaced one is fetched
    with monkeypatch.context() as patched:
        patched.setattr(Store, "get_file", lambda *a: pytest.fail("fetched again"))
        begin(config(shards_once, tmp_path / "b", init_from=hf_url), None, lambda m: None)
    s3.client.put_object(Bucket=s3.name, Key="models/hf/config.json",
                         Body=(tmp_path / "hf" / "config.json").read_bytes().replace(
                             b'"hidden_act": "gelu"', b'"hidden_act": "relu"'))
    with pytest.raises(TrainingError, match="hidden_act \"relu\""):
        begin(config(shards_once, tmp_path / "b", init_from=hf_url), None, lambda m: None)
    with pytest.raises(TrainingError, match="nothing there is a longpack checkpoint"):
        begin(config(shards_once, tmp_path / "b", init_from=s3.url("nothing")), None, print)
    gone = s3.url("nothing").replace(f"s3://{s3.name}/", "s3://no-such-bucket-here/")
    with pytest.raises(TrainingError, match=r"^--init-from s3://no-such-bucket-here/nothing: "):
        begin(config(shards_once, tmp_path / "b", init_from=gone), None, print)


def test_a_source_url_with_credentials_is_the_one_the_run_began_from(tmp_path, shards_once):
    """The record keeps a URL without its password; the run's setting has it: re-running the
    command that started the run was refused as another source."""
    from longpack.training.init_from import _resuming

    cfg = config(shards_once, tmp_path / "r", init_from="https://user:pw@host/models/neox")
    said = []
    _resuming(cfg, ({"began_from": {"source": "https://host/models/neox"}},
                    tmp_path / "r" / "step-00000002"), said.append)
    assert said == ["--init-from https://host/models/neox: the run began from it and resumes "
                    "its own checkpoint step-00000002, without reading it again"]  # no password
    with pytest.raises(TrainingError, match="the run has a checkpoint to resume"):
        _resuming(cfg, ({"began_from": {"source": "https://host/models/other"}},
                        tmp_path / "r" / "step-00000002"), said.append)
