"""zoo export --to hf for every family: GPT-NeoX as transformers' GPTNeoXForCausalLM, Mamba as
its Mamba2ForCausalLM (no remote code), MoE (and its hybrids, MTP, Mixture-of-Depths,
capacity-bound routing) and resonance with archs' own files under a thin PreTrainedModel. Each
folder is loaded by a Python process that cannot import longpack (one process for all of them;
the native ones without trust_remote_code), which gives archs' logits (1e-4; Mamba's 1e-5, on
rows of several chunks) and `longpack.archs.generate.generate`'s greedy tokens, alone and in a
left-padded batch; the folders are what the hub takes (modes, no hidden files, every named file
present, a model card)."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from test_train import config

from conftest import WITHOUT_LONGPACK
from longpack import archs
from longpack.archs.generate import generate
from longpack.archs.hf.hf_folder import layout_problems
from longpack.archs.hf.hf_remote import shipped_files
from longpack.archs.hf.transformers_compat import import_transformers
from longpack.zoo.cli import zoo
from longpack.zoo.hf_export import export_hf
from longpack.zoo.runs import TrainedRun, load_run

pytest.importorskip("transformers")

PRESETS = ["neox-tiny", "moe-tiny", "hybrid-tiny", "mamba-tiny", "resonance-tiny"]
# built from a trained preset's tokenizer, not trained: the incremental paths MoE's options
# take; Mamba's groups (B and C shared by two heads each) and a chunk of 8 (40 tokens: 5 chunks)
VARIANTS = {"moe-mod-mtp": ("moe-tiny", {"n_pred_tokens": 3, "mod_capacity": 0.5, "n_layers": 4}),
            "moe-capacity": ("moe-tiny", {"capacity_factor": 1.0}),  # generation recomputes
            "mamba-groups": ("mamba-tiny", {"n_groups": 2, "chunk": 8})}
NATIVE = {"neox-tiny": "GPTNeoXForCausalLM", "mamba-tiny": "Mamba2ForCausalLM",
          "mamba-groups": "Mamba2ForCausalLM"}  # transformers' own classes: no remote code
PROMPTS = ["alpha beta", "long-context gamma δέλτα alpha"]
NEW = 8

CHILD = WITHOUT_LONGPACK + r'''
import json
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

spec, out = json.load(open(sys.argv[1])), sys.argv[2]
results = {}
for i, (folder, job) in enumerate(spec.items()):
    # transformers' own classes load without trust_remote_code (with it False, a folder that
    # needs its code is refused)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=job["remote"])
    tok = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        torch.save(model(torch.tensor(job["ids"])).logits, f"{out}/{i}.pt")
    greedy = dict(max_new_tokens=job["new"], do_sample=False)
    one = tok(job["prompts"][0], return_tensors="pt")
    both = tok(job["prompts"], padding=True, return_tensors="pt")
    result = {"class": type(model).__name__, "keys": sorted(both),
              "mask": both["attention_mask"].tolist(), "prompt": one["input_ids"][0].tolist(),
              "greedy": model.generate(**one, **greedy)[0, one["input_ids"].shape[1]:].tolist(),
              "batched": model.generate(**both, **greedy)[:, both["input_ids"].shape[1]:].tolist()}
    # the user's own round trip: save_pretrained of the loaded model, from_pretrained of that
    # (in float32, as exported), and transformers' text-generation pipeline
    again = f"{out}/resaved-{i}"
    model.save_pretrained(again)
    reloaded = AutoModelForCausalLM.from_pretrained(again, trust_remote_code=job["remote"])
    with torch.no_grad():
        torch.save(reloaded(torch.tensor(job["ids"])).logits, f"{out}/{i}-resaved.pt")
    result["resaved"] = {name: json.load(open(f"{again}/{name}"))
                         for name in ("config.json", "generation_config.json")}
    generator = pipeline("text-generation", model=reloaded, tokenizer=tok)
    result["pipeline"] = generator(job["prompts"][0], max_new_tokens=job["new"], do_sample=False,
                                   return_full_text=False)[0]["generated_text"]
    result["greedy_text"] = tok.decode(result["greedy"], skip_special_tokens=True)
    if job["beams"]:  # the cached path's beams (reorder_cache) against recomputation's
        beams = dict(max_new_tokens=4, num_beams=3, do_sample=False)
        result["beams"] = [model.generate(**one, **beams, use_cache=c)[0].tolist()
                           for c in (True, False)]
    results[folder] = result
json.dump(results, open(f"{out}/results.json", "w"))
'''


@pytest.fixture(scope="module")
def build(shards_once) -> Path:
    """conftest's `shards` build (a 257-entry byte-level tokenizer.json, 65-token rows), read
    only: the families train on it in seconds."""
    return shards_once


def standalone(folders: dict[str, dict], tmp: Path) -> dict:
    """Run CHILD on `folders` (folder -> job) in a clean process: outside the repository, no
    PYTHONPATH, offline, transformers' module cache in `tmp`. Each result gets its logits."""
    out = tmp / "child-results"
    out.mkdir()
    (tmp / "spec.json").write_text(json.dumps(folders))
    env = {**os.environ, "HF_HOME": str(tmp / "hf-home"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp / "spec.json"), str(out)],
                          cwd=out, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    for i, folder in enumerate(folders):
        results[folder]["logits"] = torch.load(out / f"{i}.pt")
        results[folder]["resaved_logits"] = torch.load(out / f"{i}-resaved.pt")
    return results


@pytest.fixture(scope="module")
def families(tmp_path_factory, build):
    """Every preset trained 2 steps and exported with `zoo export --to hf` (Mamba's weights in
    100 kB shards, with a license), the variants exported from built models; then all of them
    loaded by one standalone process. name -> (TrainedRun, folder, the child's result)."""
    root = tmp_path_factory.mktemp("families")
    trained, folders = {}, {}
    for preset in PRESETS:
        run, out = root / "runs" / preset, root / "hf" / preset
        train(config(build, run, model=preset, max_steps=2, save_every=2, workers=0))
        extra = ["--max-shard-size", "100KB", "--license", "apache-2.0"] if preset == "mamba-tiny" \
            else []
        result = CliRunner().invoke(zoo, ["export", str(run), "--to", "hf", "--out", str(out),
                                          *extra])
        assert result.exit_code == 0, result.output
        trained[preset], folders[preset] = load_run(run), out
    for name, (preset, args) in VARIANTS.items():
        base = trained[preset]
        torch.manual_seed(0)
        model = archs.build(preset, vocab_size=base.model.cfg.vocab_size, **args).eval()
        if args.get("mod_capacity"):  # a predictor that chooses about half the tokens
            for block in model.blocks:
                if hasattr(block, "predictor"):
                    torch.nn.init.normal_(block.predictor.weight, std=1.0)
        trained[name] = TrainedRun(model, base.tokenizer, base.trained_on, base.seq,
                                   base.checkpoint)
        folders[name] = root / "hf" / name
        assert export_hf(trained[name], folders[name]) == []
    ids = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(0)).tolist()
    jobs = {str(folders[n]): {"ids": ids, "prompts": PROMPTS, "new": NEW,
                              "beams": n == "hybrid-tiny", "remote": n not in NATIVE}
            for n in folders}
    results = standalone(jobs, root)
    return {n: (trained[n], folders[n], results[str(folders[n])]) for n in folders}


def train(cfg):
    from longpack.training.loop import train as run

    run(cfg, log=lambda m: None)


def until_eos(tokens: list[int], eos: int) -> list[int]:
    """transformers pads a batch's finished rows after their EOS; generate stops at it."""
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


ALL = PRESETS + list(VARIANTS)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_a_standalone_transformers_gives_archs_logits(families, name):
    trained, folder, result = families[name]
    assert result["class"] == NATIVE.get(name, "LongpackForCausalLM")
    ids = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(0))  # the build's
    with torch.no_grad():
        ours = trained.model(ids)
    # Mamba2's chunked scan is archs' sum in another order: float32 rounding, over 3 or 5 chunks
    tolerance = 1e-5 if name.startswith("mamba") else 1e-4
    assert (result["logits"] - ours).abs().max().item() <= tolerance


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_a_loaded_export_survives_its_users_round_trip_and_pipeline(families, name):
    """save_pretrained of the loaded model, from_pretrained of that: the same logits, no
    generation setting taken from the model's own fields (MoE's experts per token was once
    `top_k`, which transformers moved into generation_config.json as top-k sampling); the
    text-generation pipeline gives the greedy tokens."""
    _, _, child = families[name]
    assert torch.equal(child["resaved_logits"], child["logits"])
    config, generation = child["resaved"]["config.json"], child["resaved"]["generation_config.json"]
    assert "top_k" not in config and "top_k" not in generation
    if name.startswith(("moe", "hybrid")):
        assert config["num_experts_per_tok"] == 2
    assert child["pipeline"] == child["greedy_text"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_greedy_generation_is_zoo_generates_alone_and_in_a_padded_batch(families, name):
    trained, folder, result = families[name]
    tokenizer = trained.tokenizer
    prompts = [tokenizer.reference.encode_flat([p])[0].tolist() for p in PROMPTS]
    assert result["prompt"] == prompts[0]  # the folder's tokenizer encodes as the build's
    ours = [generate(trained.model, p, NEW, eos_id=tokenizer.eos_id) for p in prompts]
    assert result["greedy"] == ours[0]
    # no token_type_ids; the shorter prompt padded on the left, its row generating as alone
    assert result["keys"] == ["attention_mask", "input_ids"]
    short, long = len(prompts[0]), len(prompts[1])
    assert result["mask"][0] == [0] * (long - short) + [1] * short
    assert [until_eos(row, tokenizer.eos_id) for row in result["batched"]] == ours
    if "beams" in result:
        cached, recomputed = result["beams"]
        assert cached == recomputed


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_the_folder_is_what_the_hub_takes(families, name):
    from huggingface_hub import ModelCard
    from huggingface_hub.utils import filter_repo_objects
    from huggingface_hub.utils._paths import DEFAULT_IGNORE_PATTERNS

    trained, folder, _ = families[name]
    assert layout_problems(folder) == []
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))
    # what upload_folder uploads: every file under it but .git and .cache/huggingface
    uploaded = list(filter_repo_objects(files, ignore_patterns=DEFAULT_IGNORE_PATTERNS))
    assert uploaded == files and not any(f.startswith(".") for f in files)
    assert all(stat.S_IMODE((folder / f).stat().st_mode) == 0o644 for f in files)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert not any(p.name.startswith(f".{folder.name}.") for p in folder.parent.iterdir())
    config = json.loads((folder / "config.json").read_text())
    assert config["max_position_embeddings"] >= trained.seq == 65
    eos = trained.tokenizer.eos_id
    assert json.loads((folder / "generation_config.json").read_text())["pad_token_id"] == eos
    assert json.loads((folder / "special_tokens_map.json").read_text())["pad_token"] == \
        "<|endoftext|>"
    assert json.loads((folder / "tokenizer_config.json").read_text())["model_input_names"] == \
        ["input_ids", "attention_mask"]
    card = ModelCard.load(folder / "README.md")
    assert card.data.license == ("apache-2.0" if name == "mamba-tiny" else "other")
    assert card.data.library_name == "transformers"
    assert ("custom_code" in card.data.tags) == (name not in NATIVE)
    assert ("trust_remote_code=True" in card.text) == (name not in NATIVE)
    text = card.text
    for fact in [f"{trained.model.num_params():,}", "512 (2 steps)", trained.fingerprint,
                 "200 documents, 89,395 tokens", "--model " + name, "--max-steps 2"]:
        assert fact in text, fact
    if name == "moe-tiny":
        assert f"{trained.model.active_params():,} per token" in text
    if name == "mamba-tiny":  # 0.36 MB of weights in shards of 100 kB, and their index
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        shards = sorted(set(index["weight_map"].values()))
        assert len(shards) > 1 and not (folder / "model.safetensors").exists()
        for shard in shards:  # at most 100 kB, but for a larger tensor alone in its shard
            held = [k for k, v in index["weight_map"].items() if v == shard]
            assert (folder / shard).stat().st_size <= 100_000 or len(held) == 1
    if name in NATIVE:  # transformers' own class: no code, no auto_map
        assert config["architectures"] == [NATIVE[name]] and "auto_map" not in config
        assert not list(folder.glob("*.py"))
    else:  # archs' own files, byte for byte
        for file, source in shipped_files().items():
            assert (folder / file).read_bytes() == source.read_bytes(), file


# -- quick checks (no training, no second process) ---------------------------------------------

@pytest.fixture
def byte_run(tmp_path, byte_tokenizer):
    from longpack.pipeline import load_tokenizer

    tokenizer = load_tokenizer(byte_tokenizer)

    def made(preset: str, **args) -> TrainedRun:
        torch.manual_seed(0)
        model = archs.build(preset, vocab_size=tokenizer.vocab_size, **args).eval()
        return TrainedRun(model, tokenizer, tokenizer.identity(), 1024, tmp_path / "run")

    return made


@pytest.mark.slow
def test_an_exported_folder_loads_with_its_own_code(tmp_path, byte_run):
    """In this process, as a quick check; the standalone process is the slow tests'."""
    transformers = import_transformers()
    trained = byte_run("moe-tiny")
    export_hf(trained, tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf",
                                                              trust_remote_code=True)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["max_position_embeddings"] == 1024  # the rows it trained on, past max_seq 256
    ids = torch.randint(0, 300, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model(ids).logits - trained.model(ids)).abs().max().item() <= 1e-4
        # padded rows: each row's real tokens alone, zeros where it is padded
        mask = torch.ones_like(ids)
        mask[0, :10] = 0
        padded = model(ids, attention_mask=mask).logits
        assert torch.allclose(padded[0, 10:], trained.model(ids[:1, 10:])[0], atol=1e-5)
        assert not padded[0, :10].any()
        labels = model(ids, labels=ids).loss
        expect = torch.nn.functional.cross_entropy(trained.model(ids)[:, :-1].flatten(0, 1),
                                                   ids[:, 1:].flatten())
        assert abs(labels.item() - expect.item()) < 1e-4
    assert model.generate(ids[:1, :5], max_new_tokens=6, do_sample=False)[0, 5:].tolist() == \
        generate(trained.model, ids[0, :5].tolist(), 6, eos_id=trained.tokenizer.eos_id)


@pytest.mark.slow
@pytest.mark.parametrize("args", [{}, {"n_groups": 2, "chunk": 8}])
def test_mamba_is_transformers_own_mamba2(tmp_path, byte_run, args):
    """Every weight of archs' Mamba has its place in Mamba2ForCausalLM (none missing, none
    left over, none of another shape), loaded without remote code; its logits are archs' to
    float32 rounding on rows of several chunks (40 tokens: 3 of 16, 5 of 8), with one group
    and with two; its loss, a left-padded row and greedy generation (Mamba2's own cache) are
    archs'. The weights are perturbed from their initial values first (norms at 1, biases at
    0 would hide a misplaced one)."""
    transformers = import_transformers()
    trained = byte_run("mamba-tiny", **args)
    with torch.no_grad():
        for name, weight in trained.model.named_parameters():
            if not name.endswith(("in_proj.weight", "out_proj.weight", "embed.weight")):
                weight.add_(torch.randn_like(weight) * 0.3)
    out = tmp_path / "hf"
    export_hf(trained, out)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "mamba2" and "auto_map" not in config
    assert not list(out.glob("*.py"))
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(model).__name__ == "Mamba2ForCausalLM"
    assert {k: v for k, v in info.items() if v} == {}  # no missing, unexpected, mismatched keys
    # archs' tied head as a copy of its own (hf_export.py says why): equal, not shared
    assert not model.config.tie_word_embeddings
    assert torch.equal(model.lm_head.weight, model.backbone.embeddings.weight)
    c = trained.model.cfg
    assert (model.config.n_groups, model.config.chunk_size, model.config.num_heads) == \
        (c.n_groups, c.chunk, c.expand * c.d_model // c.head_dim)
    ids = torch.randint(0, 257, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = trained.model(ids)
        assert (model(ids).logits - ours).abs().max().item() <= 1e-5
        expect = torch.nn.functional.cross_entropy(ours[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        assert abs(model(ids, labels=ids).loss.item() - expect.item()) < 1e-5
        # left padding: transformers' Mamba2 zeroes the padded inputs, so the state starts empty
        mask = torch.ones_like(ids)
        mask[0, :10] = 0
        padded = model(ids, attention_mask=mask).logits
        assert (padded[0, 10:] - trained.model(ids[:1, 10:])[0]).abs().max().item() <= 1e-5
    assert model.generate(ids[:1, :5], max_new_tokens=8, do_sample=False)[0, 5:].tolist() == \
        generate(trained.model, ids[0, :5].tolist(), 8, eos_id=trained.tokenizer.eos_id)


@pytest.mark.slow
def test_why_the_mamba2_head_is_a_copy(tmp_path):
    """hf_export.py writes Mamba's tied head as a copy of its own (tie_word_embeddings false)
    because this transformers' Mamba2ForCausalLM, tied, cannot save_pretrained: it ties the
    head on loading but lists no tied weights, so safetensors refuses the shared tensor. If
    this fails, transformers saves a tied Mamba2 now: the export can store the head once."""
    transformers = import_transformers()
    config = transformers.Mamba2Config(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                       state_size=8, expand=2, head_dim=16, num_heads=4,
                                       n_groups=1, tie_word_embeddings=True)
    model = transformers.Mamba2ForCausalLM(config)
    assert model.lm_head.weight is model.backbone.embeddings.weight
    with pytest.raises(RuntimeError, match="shared tensors"):
        model.save_pretrained(tmp_path / "tied")


def test_shipped_code_is_archs_own_and_imports_nothing_of_longpack():
    files = shipped_files()
    assert {"modeling_longpack.py", "configuration_longpack.py", "documents.py", "layers.py",
            "limits.py", "mamba.py", "moe.py", "moe_experts.py", "resonance.py"} == set(files)
    import ast

    for name, source in files.items():
        for node in ast.walk(ast.parse(source.read_text())):
            top = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            assert not any(m.split(".")[0] in ("archs", "training", "pipeline", "longpack")
                           for m in top), \
                (name, top)


def test_export_refusals_and_a_failure_leaves_nothing(tmp_path, byte_run, monkeypatch):
    from longpack import TrainingError

    trained = byte_run("resonance-tiny")
    with pytest.raises(TrainingError, match="--license 'Apache 2.0': give a license id"):
        export_hf(trained, tmp_path / "a", license="Apache 2.0")

    import longpack.zoo.hf_export

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(longpack.zoo.hf_export, "write_weights", broken)
    with pytest.raises(TrainingError, match="could not be written .*disk full.*nothing was left"):
        export_hf(trained, tmp_path / "b")
    assert not any(p.name.startswith((".b.", "b")) for p in tmp_path.iterdir())
    runner = CliRunner()
    result = runner.invoke(zoo, ["export", str(tmp_path / "none"), "--to", "hf", "--out",
                                 str(tmp_path / "c"), "--max-shard-size", "lots"])
    assert result.exit_code == 2 and "give a size such as 5GB" in result.output
    result = runner.invoke(zoo, ["export", str(tmp_path / "none"), "--to", "safetensors",
                                 "--out", str(tmp_path / "c"), "--license", "mit"])
    assert result.exit_code == 1 and "are --to hf's" in result.output
