"""A step whose loss or gradient norm is not finite: its update skipped on the device (no host
read), counted in metrics and on the console, the run stopped after --max-skipped-steps of them
in a row, and never a checkpoint of weights that are not finite."""

import json
import math

import pytest
import torch

from longpack import archs
from longpack.core.errors import TrainingError
from longpack.training.config import TrainConfig
from longpack.training.parallel.distributed import launched
from longpack.training.step import prepare, train_step


def poisoned_embedding(model, steps: set, calls: list):
    """A forward hook that makes the embedding's output NaN on the forwards numbered in
    `steps` (counted in `calls`): that step's loss and every gradient are NaN."""
    embedding = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding))

    def hook(_module, _inputs, output):
        calls.append(1)
        return output * float("nan") if len(calls) - 1 in steps else output

    embedding.register_forward_hook(hook)


def batch_of(vocab=300, seed=0):
    x = torch.randint(0, vocab, (2, 17), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": x[:, :-1], "targets": x[:, 1:], "doc_starts": torch.zeros(2, 1).long()}


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_nan_step_leaves_weights_and_optimizer_state_as_they_were(optimizer):
    """Before: the update ran with NaN gradients and every weight became NaN, seen only at the
    next logged step."""
    torch.manual_seed(0)
    model = archs.build("neox-tiny", vocab_size=300)
    calls = []
    poisoned_embedding(model, {1}, calls)
    cfg = TrainConfig(shards="x", model="neox-tiny", optimizer=optimizer, lr=0.01, warmup=0)
    procs = launched()
    state = prepare(model, cfg, procs)
    first = train_step(state, [batch_of(seed=0)], 0, cfg, procs)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    moments = [{k: v.clone() for k, v in s.items()} for opt in state.optimizers
               for s in opt.state.values()]
    bad = train_step(state, [batch_of(seed=1)], 1, cfg, procs)
    assert not first.read()["skipped"] and bad.read()["skipped"]
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), weights[n]), n
    after = [s for opt in state.optimizers for s in opt.state.values()]
    for was, now in zip(moments, after):
        for k, v in was.items():
            assert torch.equal(v, now[k]), k  # AdamW's step count too
    good = train_step(state, [batch_of(seed=2)], 2, cfg, procs)
    assert not good.read()["skipped"]
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(p.detach(), weights[n]) for n, p in model.named_parameters())
    assert not any(hasattr(opt, "found_inf") for opt in state.optimizers)


def test_an_infinite_gradient_norm_is_skipped_too():
    torch.manual_seed(0)
    model = archs.build("neox-tiny", vocab_size=300)
    cfg = TrainConfig(shards="x", model="neox-tiny", lr=0.01, warmup=0, clip=0)
    state = prepare(model, cfg, launched())
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    head = next(p for n, p in model.named_parameters() if model.param_roles()[n] == "head")
    head.register_hook(lambda g: g * float("inf"))  # a finite loss, an infinite gradient
    out = train_step(state, [batch_of()], 0, cfg, launched()).read()
    assert out["skipped"] and math.isfinite(out["loss"]) and not math.isfinite(out["grad_norm"])
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), weights[n]), n


@pytest.fixture
def build_dir(tmp_path, byte_tokenizer):
    from test_train import padded_build

    return padded_build(tmp_path, byte_tokenizer)


def run_config(build_dir, tmp_path, **kw) -> TrainConfig:
    base = dict(shards=str(build_dir), model="neox-tiny", out=str(tmp_path / "r"), batch_size=2,
                warmup=0, save_every=100, eval_every=100, log_every=100, workers=0)
    return TrainConfig(**{**base, **kw})


def run_with_nan_at(monkeypatch, steps: set):
    """train() whose model's forwards at `steps` (training forwards counted from 0; the
    evaluation's forwards run after) give NaN."""
    real = archs.build
    calls = []

    def build(*args, **kwargs):
        model = real(*args, **kwargs)
        poisoned_embedding(model, steps, calls)
        return model

    monkeypatch.setattr(archs, "build", build)


def test_a_skipped_step_is_counted_and_said_and_the_run_carries_on(tmp_path, build_dir,
                                                                   monkeypatch):
    from longpack.training.loop import train

    run_with_nan_at(monkeypatch, {2})
    said = []
    history = train(run_config(build_dir, tmp_path, max_steps=5, lr=3e-3), log=said.append)
    assert [h.get("skipped", False) for h in history] == [False, False, True, False, False]
    skipped = history[2]
    assert skipped["loss"] is None and "loss" in skipped["nonfinite"]
    assert skipped["skipped_in_a_row"] == 1
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[2])["skipped"] is True  # strict JSON: no NaN in the file
    assert "NaN" not in "".join(lines)
    assert any(line.startswith("step 2: the loss") and "update was skipped (1 in a row, 1 in "
               "this run; --max-skipped-steps 3)" in line for line in said), said
    from longpack.training.checkpoints import checkpoint

    weights = checkpoint.model_state(checkpoint.load_latest(tmp_path / "r"))
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_a_val_loss_that_is_not_finite_is_null_in_metrics_jsonl(tmp_path, build_dir,
                                                               monkeypatch):
    """The evaluation's forwards (after training's 0 and 1) give NaN: metrics.jsonl held a bare
    NaN, which no strict JSON reader takes."""
    from longpack.training.loop import train

    run_with_nan_at(monkeypatch, {2, 3, 4, 5})
    history = train(run_config(build_dir, tmp_path, max_steps=2, eval_every=2), log=lambda m: None)
    assert math.isnan(history[-1]["val_loss"])  # what the run saw, as it was
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1], parse_constant=lambda c: pytest.fail(f"{c} in metrics.jsonl"))
    assert last["val_loss"] is None and "val_loss" in last["nonfinite"]
    assert last["loss"] is not None and "skipped" not in last


def test_fp16_overflows_that_never_end_stop_the_run(tmp_path):
    """An overflow with a finite loss is fp16's routine and no step towards --max-skipped-steps;
    one at every step skipped every step for ever, said each time."""
    from longpack.training.loop import SkippedSteps

    skips = SkippedSteps(3, "fp16")
    overflow = {"skipped": True, "nonfinite": ["grad_norm"]}
    for step in range(SkippedSteps.OVERFLOWS_LIMIT - 1):
        skips.count(record := {**overflow, "step": step})
        assert "fp16's overflow, its scale lowered" in skips.after(record, tmp_path)
    skips.count({"step": 39})  # a good step: the count starts again
    for step in range(40, 40 + SkippedSteps.OVERFLOWS_LIMIT - 1):
        skips.count(record := {**overflow, "step": step})
        skips.after(record, tmp_path)
    skips.count(record := {**overflow, "step": 79})
    with pytest.raises(TrainingError, match=r"^40 steps in a row \(to step 79\) had fp16 "
                       r"gradients that overflow.*--precision bf16\)$"):
        skips.after(record, tmp_path)


def test_max_skipped_steps_in_a_row_stop_the_run_in_one_line(tmp_path, build_dir, monkeypatch):
    from longpack.training.loop import train

    run_with_nan_at(monkeypatch, {1, 2, 3, 4, 5})
    cfg = run_config(build_dir, tmp_path, max_steps=8, log_every=1, max_skipped_steps=2)
    with pytest.raises(TrainingError, match=r"^2 steps in a row \(to step 2\) had a loss or "
                       r"gradient norm that is not finite"):
        train(cfg, log=lambda _: None)
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [x.get("skipped", False) for x in lines] == [False, True, True]


def test_weights_that_are_not_finite_are_never_saved(tmp_path, build_dir, monkeypatch):
    """A poisoned parameter (its update skipped, it stays NaN): the save is refused in one line
    and no checkpoint folder is written."""
    from longpack.training.loop import train

    real = archs.build

    def build(*args, **kwargs):
        model = real(*args, **kwargs)
        if kwargs.get("device") != "meta":  # not the memory planner's
            with torch.no_grad():
                next(p for n, p in model.named_parameters() if "ln" in n).fill_(float("nan"))
        return model

    monkeypatch.setattr(archs, "build", build)
    cfg = run_config(build_dir, tmp_path, max_steps=2, save_every=1, max_skipped_steps=5)
    with pytest.raises(TrainingError, match=r"the weights \(.*ln.*\) are not finite at step 1: "
                                            r"no checkpoint is written"):
        train(cfg, log=lambda _: None)
    assert not list((tmp_path / "r").glob("step-*"))


def test_under_fp16_both_optimizers_skip_together_and_the_scale_is_lowered():
    """Before: fp16's scaler replaced the trainer's flag with its own, per optimizer (Muon could
    update while AdamW skipped), and read it to the host for Muon at every step."""
    from longpack.training.loop import SkippedSteps

    torch.manual_seed(0)
    model = archs.build("neox-tiny", vocab_size=300)
    calls = []
    poisoned_embedding(model, {0}, calls)
    cfg = TrainConfig(shards="x", model="neox-tiny", optimizer="muon", precision="fp16",
                      lr=0.01, warmup=0)
    state = prepare(model, cfg, launched())
    scale = state.scaler.get_scale()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = train_step(state, [batch_of()], 0, cfg, launched()).read()
    assert out["skipped"]
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), weights[n]), n
    assert state.scaler.get_scale() < scale
    skips = SkippedSteps(2, "fp16")  # an overflow alone (finite loss) is no step to the limit
    for nonfinite in (["grad_norm"], ["grad_norm"], ["grad_norm"], ["loss", "grad_norm"]):
        record = {"step": 0, "skipped": True, "nonfinite": nonfinite}
        skips.count(record)
        assert "--max-skipped-steps" not in skips.after(record, "run") or nonfinite[0] == "loss"
    assert skips.in_a_row == 1 and skips.total == 4


def test_a_signal_ignored_at_start_stays_ignored_nohup():
    """`nohup train ...` ignores SIGHUP: a closed terminal must not stop that run."""
    import os
    import signal

    from longpack.training.loop import stop_requested

    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # put back by conftest's fixture
    with stop_requested(lambda _: None) as stop:
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGHUP)
        assert not stop.requested
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    with stop_requested(lambda _: None) as stop:
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGHUP)  # a second hangup: no stop at once, no checkpoint lost
        assert stop.requested


@pytest.mark.slow
def test_two_processes_skip_and_stop_together_with_ddp_and_fsdp(tmp_path, shards_once):
    """A learning rate that blows the weights up: every process skips the same steps (the
    flag is of the global norm) and stops at --max-skipped-steps in one line, under DDP with
    AdamW and --fsdp with Muon's sharded update; no process waits for another."""
    from conftest import run_train_jobs

    jobs = []
    for name, more in (("ddp", []), ("fsdp", ["--fsdp", "--optimizer", "muon",
                                              "--muon-lr", "1e30"])):
        jobs.append({"argv": ["--shards", str(shards_once), "--out", str(tmp_path / name),
                              "--model", "neox-tiny", "--batch-size", "2", "--max-steps", "30",
                              "--lr", "1e30", "--weight-decay", "0", "--warmup", "0", "--clip",
                              "0", "--log-every", "1", "--save-every", "100", "--workers", "0",
                              *more],
                     "stdout": str(tmp_path / name)})
    run_train_jobs(tmp_path, jobs, timeout=300)
    for name in ("ddp", "fsdp"):
        said = [(tmp_path / f"{name}.rank{rank}").read_text() for rank in (0, 1)]
        for printed in said:
            errors = [line for line in printed.splitlines() if line.startswith("Error: ")]
            assert len(errors) == 1 and "steps in a row" in errors[0] and \
                "were skipped: the run stops" in errors[0], (name, printed[-2000:])
        assert not any((tmp_path / name).glob("step-*")), name  # nothing non-finite saved
