"""A Mamba trained before its final norm became Mamba-2's RMSNorm (`norm_f.weight`) ends in a
LayerNorm (`ln_f.weight`, `ln_f.bias`): no weights make one the other, so its checkpoints are
refused in one line, by the model's own load (longpack.archs.mamba: `zoo export`, `generate`, `eval`,
`archs.load`) and by `train --resume`, whichever format holds them (DCP files, or state.pt of
format 2). Other families' `ln_f` is untouched."""

import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from click.testing import CliRunner
from test_train import config

from longpack import TrainingError, archs
from longpack.archs.mamba import OutdatedWeights, refuse_layernorm_weights
from longpack.training.checkpoints import checkpoint
from longpack.training.loop import train
from longpack.zoo.cli import zoo

WHAT = ("a Mamba that ends in a LayerNorm (ln_f.weight and ln_f.bias): it was trained before "
        "Mamba's final norm became Mamba-2's RMSNorm (norm_f.weight), and no weights make one "
        "the other; train it again with this longpack, or export, generate and eval it with "
        "the longpack that trained it")


def with_layernorm(names_to_tensors: dict) -> dict:
    """The same tensors as a Mamba of before held them: each `norm_f.weight` (the model's, its
    optimizer states') as `ln_f.weight`, beside an `ln_f.bias` of its shape."""
    out = {}
    for name, t in names_to_tensors.items():
        if "norm_f.weight" in name:
            out[name.replace("norm_f.weight", "ln_f.weight")] = t
            # a 0-d tensor is AdamW's step count: the bias has its own, the same
            out[name.replace("norm_f.weight", "ln_f.bias")] = (
                t.clone() if t.dim() == 0 else torch.zeros_like(t))
        else:
            out[name] = t
    return out


def test_only_a_mamba_with_a_layernorm_is_refused():
    torch.manual_seed(0)
    mamba = archs.build("mamba-tiny").state_dict()
    assert "norm_f.weight" in mamba and not any("ln_f" in n for n in mamba)
    old = with_layernorm(mamba)
    for names in (old, [f"model.{n}" for n in old],
                  [f"optimizers.state.{n}.exp_avg" for n in old]):
        with pytest.raises(OutdatedWeights) as refused:
            refuse_layernorm_weights(names)
        assert str(refused.value) == WHAT
    for preset in ("mamba-tiny", "neox-tiny", "resonance-tiny", "hybrid-tiny", "moe-tiny"):
        refuse_layernorm_weights(archs.build(preset, device="meta").state_dict())  # passes


def test_the_model_refuses_them_however_it_is_loaded(tmp_path):
    torch.manual_seed(0)
    model = archs.build("mamba-tiny")
    old = with_layernorm(model.state_dict())
    for strict in (True, False):  # strict=False would otherwise drop them silently
        with pytest.raises(OutdatedWeights, match=r"^a Mamba that ends in a LayerNorm"):
            model.load_state_dict(old, strict=strict)
    wrapped = torch.nn.Sequential(model)  # under a prefix, as a wrapper holds it
    with pytest.raises(OutdatedWeights):
        wrapped.load_state_dict({f"0.{k}": v for k, v in old.items()})
    # a `zoo export --to safetensors` folder of before: archs.load refuses it too
    archs.save(model, tmp_path / "st")
    from safetensors.torch import load_file, save_file

    weights = load_file(str(tmp_path / "st" / "model.safetensors"))
    save_file(with_layernorm(weights), str(tmp_path / "st" / "model.safetensors"))
    with pytest.raises(OutdatedWeights, match=r"^a Mamba that ends in a LayerNorm"):
        archs.load(tmp_path / "st")
    # the other families keep their LayerNorm `ln_f`, and load as before
    neox = archs.build("neox-tiny")
    assert {"ln_f.weight", "ln_f.bias"} <= set(neox.state_dict())
    neox.load_state_dict(archs.build("neox-tiny").state_dict())


@pytest.fixture(scope="module")
def mamba_run(tmp_path_factory, shards_once):
    """mamba-tiny trained one step, checkpointed (DCP files), once for the module."""
    run = tmp_path_factory.mktemp("mamba") / "run"
    train(config(shards_once, run, model="mamba-tiny", max_steps=1, warmup=0, save_every=1,
                 workers=0), log=lambda m: None)
    return run


def outdated_copy(run: Path, to: Path, fmt: int) -> Path:
    """A copy of `run` whose checkpoint is what a Mamba of before wrote: format 3 (DCP files:
    the model's and AdamW's tensors, the param_groups' names in state.pt) or format 2 (the
    model and optimizer states in state.pt, optimizer state by position)."""
    run = Path(shutil.copytree(run, to))
    step = run / "step-00000001"
    state = torch.load(step / "state.pt", weights_only=False)
    tensors = with_layernorm(checkpoint.tensors(step, ""))
    for group in state["param_groups"]:  # by name: the bias follows the weight
        group["params"] = [m for n in group["params"] for m in (
            ["ln_f.weight", "ln_f.bias"] if n == "norm_f.weight" else [n])]
    for part in [step / ".metadata", *step.glob("*.distcp")]:
        part.unlink()
    if fmt == 3:
        with warnings.catch_warnings():  # no_dist: "assuming ... a single process", as meant
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(tensors, checkpoint_id=step, no_dist=True)
    else:  # by position, each group's parameters in order, as torch's state_dict numbers them
        names = [n for group in state["param_groups"] for n in group["params"]]
        optimizer = {"state": {i: {k[len(f"optimizers.state.{n}."):]: v
                                   for k, v in tensors.items()
                                   if k.startswith(f"optimizers.state.{n}.")}
                               for i, n in enumerate(names)},
                     "param_groups": [{**g, "params": list(range(sum(
                         len(h["params"]) for h in state["param_groups"][:j]), sum(
                         len(h["params"]) for h in state["param_groups"][:j + 1])))}
                         for j, g in enumerate(state["param_groups"])]}
        model = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        state = {**state, "format": 2, "model": model, "optimizers": [optimizer]}
        del state["param_groups"]
    torch.save(state, step / "state.pt")
    files = sorted(p.name for p in step.iterdir() if p.name != "COMPLETE")
    (step / "COMPLETE").write_text("".join(f"{checkpoint.sha256_file(step / n)}  {n}\n"
                                           for n in files) + checkpoint.RECORD.format(1) + "\n")
    return run


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [3, 2])
def test_zoo_refuses_a_mamba_of_before_in_one_line(tmp_path, mamba_run, shards_once, fmt):
    run = outdated_copy(mamba_run, tmp_path / "old", fmt)
    assert "ln_f.bias" in checkpoint.model_state(checkpoint.load_latest(run))
    want = f"Error: {run / 'step-00000001'} holds {WHAT}"
    for args in (["export", str(run), "--to", "hf", "--out", str(tmp_path / "hf")],
                 ["export", str(run), "--to", "safetensors", "--out", str(tmp_path / "st")],
                 ["generate", str(run), "--prompt", "alpha", "--max-new-tokens", "2"],
                 ["eval", str(run), "--shards", str(shards_once), "--limit", "1"]):
        result = CliRunner().invoke(zoo, args)
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output
        assert result.output.strip().splitlines() == [want], args
    assert not (tmp_path / "hf").exists() and not (tmp_path / "st").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [3, 2])
def test_train_resume_refuses_a_mamba_of_before_in_one_line(tmp_path, mamba_run, shards_once,
                                                            fmt):
    run = outdated_copy(mamba_run, tmp_path / "old", fmt)
    cfg = config(shards_once, run, model="mamba-tiny", max_steps=2, warmup=0, save_every=1,
                 workers=0)
    with pytest.raises(TrainingError) as refused:
        train(cfg, log=lambda m: None)
    assert str(refused.value) == (
        f"{run / 'step-00000001'}: its weights do not fit --model mamba-tiny as archs/ builds "
        f"it now ({WHAT}); pass --resume never or another --out to start afresh")
    assert not (run / "step-00000002").exists()
    # the run as it is now resumes (the crafted copy differs from it only there)
    train(config(shards_once, Path(shutil.copytree(mamba_run, tmp_path / "now")),
                 model="mamba-tiny", max_steps=2, warmup=0, save_every=1, workers=0),
          log=lambda m: None)
    assert (tmp_path / "now" / "step-00000002").is_dir()
