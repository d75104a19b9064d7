"""The trainer so far, on CPU with a tiny model: exact resume, refusals, fallbacks, schedules."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import vocab_of, write_jsonl
from longpack import archs
from longpack.core.errors import SettingsError, TrainingError
from longpack.pipeline.builds.reader import open_build
from longpack.training.checkpoints import checkpoint
from longpack.training.cli import train as train_cli
from longpack.training.config import TrainConfig
from longpack.training.data.mixture import Sources
from longpack.training.loop import evaluate, train
from longpack.training.optim import lr_at
from longpack.training.parallel.distributed import launched


def config(shards, out, **kw):
    base = dict(shards=str(shards), model="neox-tiny", out=str(out), batch_size=4,
                max_steps=8, warmup=2, lr=3e-3, save_every=3, log_every=100)
    return TrainConfig(**{**base, **kw})


def weights(run):
    return checkpoint.model_state(checkpoint.load_latest(run))


def padded_build(tmp_path, byte_tokenizer, val_text_bytes=20):
    """A build whose rows are mostly padding, where an average of per-batch means goes wrong.

    train: one document of 70 tokens -> a full 65-token row and a row of 5 real tokens (4 real
    targets of 64). val: one document of val_text_bytes + 1 tokens in one padded row. The texts
    are picked by the build's own splitter (val_fraction 0.5)."""
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig
    from longpack.pipeline.tokenize.split import Splitter, doc_hash

    splitter = Splitter(0.5, 0)
    texts = (f"{i:04d}" + "v" * (val_text_bytes - 4) for i in range(100))
    val = next(t for t in texts if splitter.is_val(doc_hash(t)))
    texts = (f"{i:04d}" + "t" * 65 for i in range(100))
    train_doc = next(t for t in texts if not splitter.is_val(doc_hash(t)))
    write_jsonl(tmp_path / "p.jsonl", [{"text": train_doc}, {"text": val}])
    out = tmp_path / "padded"
    build(BuildConfig(out=str(out), dataset="jsonl", inputs=(str(tmp_path / "p.jsonl"),),
                      tokenizer=byte_tokenizer, seq=65, val_fraction=0.5), show_progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["rows"] == 2 and manifest["splits"]["val"]["rows"] == 1
    return out


def test_val_loss_is_the_mean_over_real_targets_whatever_the_batching(tmp_path, byte_tokenizer):
    # One val row of 21 real tokens cut into 5 windows of 13: windows 2-4 are all padding.
    shards = padded_build(tmp_path, byte_tokenizer)
    build = open_build(str(shards), tmp_path / "cache", "1gb", seq=13)
    torch.manual_seed(0)
    device = launched().device  # where evaluate puts the batches: a GPU where there is one
    model = archs.build("neox-tiny", vocab_size=50257, device=device)
    rows = [build.val.get(i) for i in range(len(build.val))]
    assert len(rows) == 5
    from longpack.training.data.loader import make_batch

    batch = make_batch(rows, device)
    with torch.no_grad():
        logits = model(batch["input_ids"], batch["doc_starts"])
    real = batch["targets"] != -100
    assert int(real.sum()) == 12 + 7  # window 0: 12 targets; window 1: 7, then padding
    expected = torch.nn.functional.cross_entropy(logits[real], batch["targets"][real]).item()
    for batch_size, eval_batches in ((1, 5), (2, 3), (5, 1)):
        cfg = config(shards, tmp_path / "r", seq=13, batch_size=batch_size,
                     eval_batches=eval_batches)
        got = evaluate(model, Sources(["padded"], [build]), cfg, launched())
        assert got["val_loss"] == pytest.approx(expected, rel=1e-5), (batch_size, eval_batches)
        assert got["val_targets"] == 19


@pytest.mark.slow
def test_a_step_of_padding_only_trains_on_and_records_no_loss(tmp_path, byte_tokenizer):
    # --seq 13: the second train row (5 real tokens, then padding) gives 4 windows of padding
    # only; with one sample per step, 4 of the epoch's 10 steps have nothing to predict.
    shards = padded_build(tmp_path, byte_tokenizer)
    history = train(config(shards, tmp_path / "r", seq=13, batch_size=1, max_steps=10,
                           save_every=100, workers=0), log=lambda m: None)
    empty = [h for h in history if h["targets"] == 0]
    assert len(empty) == 4 and all(h["loss"] is None for h in empty)
    assert all(h["loss"] > 0 for h in history if h["targets"])
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    assert sum(json.loads(line)["loss"] is None for line in lines) == 4


@pytest.mark.slow
def test_grad_accum_splits_the_step_without_changing_its_loss(tmp_path, byte_tokenizer):
    # Each step is the two train rows: 64 real targets and 4. One micro-batch of both, or two
    # of one each, must be the same objective: the mean over the step's 68 real targets.
    shards = padded_build(tmp_path, byte_tokenizer)
    whole = train(config(shards, tmp_path / "a", batch_size=2, grad_accum=1, max_steps=4,
                         workers=0), log=lambda m: None)
    split = train(config(shards, tmp_path / "b", batch_size=1, grad_accum=2, max_steps=4,
                         workers=0), log=lambda m: None)
    assert [h["loss"] for h in split] == pytest.approx([h["loss"] for h in whole], rel=1e-5)
    assert [h["targets"] for h in split] == [68] * 4
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    # atol: the key bias has a near-zero gradient (softmax ignores a shift) whose rounding
    # AdamW scales up to ~1e-6 (as in test_train_distributed.py)
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5) for k in a)


TIMINGS = ("seconds", "data_seconds", "tokens_per_second", "eta_seconds", "mfu")


def records(run, drop=TIMINGS):
    """metrics.jsonl's records, without the wall-clock figures no two runs share."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in lines]










@pytest.mark.slow
def test_loss_falls_and_val_loss_follows(tmp_path, shards):
    history = train(config(shards, tmp_path / "r", max_steps=40, save_every=40, eval_every=20),
                    log=lambda m: None)
    assert sum(h["loss"] for h in history[-5:]) / 5 < 0.8 * history[0]["loss"]
    evals = [h for h in history if "val_loss" in h]
    assert [h["step"] for h in evals] == [19, 39]
    assert evals[-1]["val_loss"] < history[0]["loss"]
    assert evals[-1]["val_ppl"] == pytest.approx(torch.tensor(evals[-1]["val_loss"]).exp().item(),
                                                 rel=1e-5)


def test_a_warmup_longer_than_the_run_is_cut_to_the_run_and_said():
    """The default --warmup 10 refused every run of fewer steps (a smoke test)."""
    from longpack.training.setup import resolve_steps

    said = []
    cfg = resolve_steps(TrainConfig(shards="x", max_steps=4, lr=1.0), seq=65, log=said.append)
    assert cfg.warmup == 4 and said == ["--warmup 10 is longer than the run's 4 steps: the "
                                        "learning rate warms up over all 4"]
    assert [lr_at(s, cfg) for s in range(4)] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    # --total-tokens resolves first: 2 steps of 8 x 64 predictions
    cfg = resolve_steps(TrainConfig(shards="x", total_tokens=1024, warmup=3), seq=65,
                        log=said.append)
    assert (cfg.max_steps, cfg.warmup) == (2, 2) and len(said) == 2
    assert resolve_steps(TrainConfig(shards="x", max_steps=40), 65, log=said.append).warmup == 10


def test_schedule_shapes(tmp_path):
    cfg = TrainConfig(shards="x", max_steps=100, warmup=10, lr=1.0, min_lr=0.1)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:])) and lrs[-1] > 0.1 - 1e-9
    wsd = TrainConfig(shards="x", max_steps=100, warmup=10, lr=1.0, min_lr=0.1, schedule="wsd")
    w = [lr_at(s, wsd) for s in range(101)]
    assert w[50] == 1.0 and w[100] == pytest.approx(0.1) and w[90] < 1.0
    const = TrainConfig(shards="x", max_steps=100, warmup=10, lr=1.0, schedule="constant")
    assert lr_at(99, const) == 1.0


@pytest.mark.parametrize("name", ["neox-tiny", "resonance-tiny"])
def test_a_muon_step_orthogonalizes_the_hidden_matrices_and_adamw_moves_the_rest(name):
    """Our grouping, through the trainer's own step: each parameter moves as the optimizer of
    its role alone would move it: a hidden matrix as torch.optim.Muon, anything else by
    AdamW's first step, exactly lr * g / (|g| + eps) after its decay (if its role has one)."""
    from longpack.training.step import prepare, train_step

    torch.manual_seed(0)
    model = archs.build(name, vocab_size=300)
    x = torch.randint(0, 300, (4, 33))
    batch = {"input_ids": x[:, :-1], "targets": x[:, 1:], "doc_starts": torch.zeros(4, 1).long()}
    model.loss(**batch)["loss"].backward()  # the gradient the step will take
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = TrainConfig(shards="x", model=name, optimizer="muon", lr=0.01, weight_decay=0.1,
                      warmup=0, clip=0)
    train_step(prepare(model, cfg, launched()), [batch], 0, cfg, launched())
    roles = model.param_roles()
    decayed = {"matrix", "head"}  # the roles AdamW and Muon decay (docs: training/optim.py)
    for n, p in model.named_parameters():
        w, g = before[n], grads[n]
        if roles[n] == "matrix":
            alone = torch.nn.Parameter(w.clone())
            alone.grad = g
            torch.optim.Muon([alone], lr=cfg.lr, weight_decay=cfg.weight_decay).step()
            assert torch.allclose(p.detach(), alone.detach(), atol=1e-6), n
        else:
            moved = w * (1 - cfg.lr * cfg.weight_decay * (roles[n] in decayed)) - p.detach()
            assert torch.allclose(moved, cfg.lr * g / (g.abs() + 1e-8), atol=cfg.lr * 1e-4), n
    assert {"matrix", "head", "embedding", "norm"} <= set(roles.values())


@pytest.mark.slow
def test_train_cli_runs_and_resumes(tmp_path, shards):
    args = ["--shards", str(shards), "--out", str(tmp_path / "r"), "--batch-size", "2",
            "--max-steps", "4", "--warmup", "1", "--save-every", "2", "--optimizer", "muon"]
    r = CliRunner().invoke(train_cli, args)
    assert r.exit_code == 0, r.output
    assert "done: step 4" in r.output
    r = CliRunner().invoke(train_cli, [*args[:-4], "--max-steps", "6", "--warmup", "1",
                                       "--save-every", "2", "--optimizer", "muon"])
    assert r.exit_code == 0 and "resumed from" in r.output and "done: step 6" in r.output




@pytest.mark.slow
def test_total_tokens_sets_the_number_of_steps(tmp_path, shards):
    history = train(config(shards, tmp_path / "r", total_tokens=4 * 64 * 5 + 1, save_every=100),
                    log=lambda m: None)
    assert len(history) == 6  # 4 rows x 64 predictions per step: 1281 tokens need 6 steps


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path, shards, precision):
    history = train(config(shards, tmp_path / precision, precision=precision, max_steps=8,
                           save_every=100), log=lambda m: None)
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    assert sum(h["loss"] for h in history[-3:]) / 3 < history[0]["loss"]


def test_dry_run_prints_the_plan_and_trains_nothing(tmp_path, shards):
    r = CliRunner().invoke(train_cli, ["--shards", str(shards), "--out", str(tmp_path / "r"),
                                       "--batch-size", "4", "--total-tokens", "100000",
                                       "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "nothing is trained" in r.output and "256 tokens/step x 391 steps" in r.output
    params = archs.build("neox-tiny", vocab_size=vocab_of(shards), device="meta").num_params()
    assert "ETA" in r.output and f"{params:,} parameters" in r.output
    assert not (tmp_path / "r").exists()


def test_config_file_with_command_line_overrides(tmp_path, shards):
    (tmp_path / "run.toml").write_text(
        f'shards = "{shards}"\nbatch_size = 2\nmax_steps = 3\nwarmup = 1\nlr = 0.001\n')
    r = CliRunner().invoke(train_cli, ["--config", str(tmp_path / "run.toml"), "--max-steps", "2",
                                       "--out", str(tmp_path / "r"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "batch_size=2" in r.output and "max_steps=2" in r.output and "lr=0.001" in r.output
    (tmp_path / "bad.toml").write_text("nonsense = 1\n")
    r = CliRunner().invoke(train_cli, ["--config", str(tmp_path / "bad.toml")])
    assert r.exit_code == 2 and "unknown setting nonsense" in r.output


def test_metrics_jsonl_has_every_step(tmp_path, shards):
    train(config(shards, tmp_path / "r", max_steps=4), log=lambda m: None)
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2, 3]
    assert all(x["tokens_per_second"] > 0 and len(x["batch"]) == 12 for x in lines)


@pytest.mark.parametrize("kind, modules", [("tensorboard", ("tensorboard",
                                                            "torch.utils.tensorboard")),
                                           ("wandb", ("wandb",))])
def test_a_missing_logger_is_refused_saying_what_to_install(tmp_path, shards, monkeypatch, kind,
                                                           modules):
    # None in sys.modules makes `import` fail as if the package were not installed, so this
    # runs whether or not it is.
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(SettingsError, match=f"--report-to {kind} needs the {kind} package: pip "
                                         f"install '{kind}>=[0-9.]+' \\(the extra \\[{kind}\\]\\)"):
        train(config(shards, tmp_path / "t", max_steps=2, report_to=("jsonl", kind)),
              log=lambda m: None)
    assert not (tmp_path / "t").exists()  # refused before the run made anything
    from longpack.training.dry_run import plan  # and by the dry run, which passed it before

    with pytest.raises(SettingsError, match=f"--report-to {kind} needs the {kind} package"):
        plan(config(shards, tmp_path / "t", max_steps=2, report_to=("jsonl", kind)),
             say=lambda m: None)


def test_tensorboard_gets_every_step(tmp_path, shards):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(config(shards, tmp_path / "r", max_steps=3, workers=0,
                 report_to=("jsonl", "tensorboard")), log=lambda m: None)
    events = EventAccumulator(str(tmp_path / "r" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [0, 1, 2]


@pytest.mark.slow
def test_loader_workers_do_not_change_the_run(tmp_path, shards):
    inline = train(config(shards, tmp_path / "a", max_steps=4, workers=0), log=lambda m: None)
    workers = train(config(shards, tmp_path / "b", max_steps=4, workers=2), log=lambda m: None)
    assert [h["loss"] for h in inline] == [h["loss"] for h in workers]
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_seq_trains_on_windows_and_a_resume_with_another_seq_is_refused(tmp_path, shards):
    history = train(config(shards, tmp_path / "r", seq=13, max_steps=3), log=lambda m: None)
    assert history[-1]["tokens"] == 3 * 4 * 12  # steps x samples x (seq - 1) predictions
    with pytest.raises(TrainingError, match="trained with --seq 13, this run has 65"):
        train(config(shards, tmp_path / "r", max_steps=6), log=lambda m: None)




def test_bad_data_settings_are_one_line_errors_not_tracebacks(tmp_path, shards):
    r = CliRunner().invoke(train_cli, ["--shards", str(shards), "--out", str(tmp_path / "r"),
                                       "--seq", "24"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "Error: --seq 24: the build's rows are 65 tokens; use a divisor" in r.output
    r = CliRunner().invoke(train_cli, ["--shards", str(tmp_path / "nowhere"), "--out",
                                       str(tmp_path / "r")])
    assert r.exit_code == 1 and "manifest.json not found" in r.output


@pytest.mark.slow
def test_compile_trains_like_eager(tmp_path, shards):
    eager = train(config(shards, tmp_path / "a", max_steps=2, workers=0), log=lambda m: None)
    compiled = train(config(shards, tmp_path / "b", max_steps=2, workers=0, compile=True),
                     log=lambda m: None)
    assert [h["loss"] for h in compiled] == pytest.approx([h["loss"] for h in eager], rel=1e-4)


@pytest.mark.parametrize("name", ["neox-tiny", "moe-tiny", "resonance-tiny"])
def test_models_draw_no_random_numbers_while_training(name):
    # What lets the trainer promise results independent of ranks: nothing random in a step.
    torch.manual_seed(0)
    model = archs.build(name, vocab_size=300).train()
    x = torch.randint(0, 300, (2, 64))
    starts = torch.tensor([[0, 20], [0, -1]])
    first = model.loss(x, x, starts)["loss"]
    torch.manual_seed(123)  # another RNG state: a dropout or noisy router would now differ
    assert torch.equal(first, model.loss(x, x, starts)["loss"])


@pytest.mark.parametrize("content, says", [
    (b"\xff\xfe{}", "not valid JSON"),  # was a UnicodeDecodeError
    (b'{"seq": 65}', "not a longpack manifest (no format, tokenizer, splits, fingerprint)"),
    (b"[1]", "not a longpack manifest (no everything: it is not a JSON object)"),  # TypeError
])
def test_a_damaged_manifest_is_one_line_for_train_and_zoo_eval(tmp_path, shards, content, says):
    from longpack.zoo.cli import zoo

    (shards / "manifest.json").write_bytes(content)
    r = CliRunner().invoke(train_cli, ["--shards", str(shards), "--out", str(tmp_path / "r")])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert says in r.output.strip().splitlines()[-1]
    r = CliRunner().invoke(zoo, ["eval", str(tmp_path / "no-run"), "--shards", str(shards)])
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit), r.output


@pytest.mark.slow
def test_a_step_reads_nothing_back_to_the_host_between_logged_steps(tmp_path, byte_tokenizer,
                                                                    monkeypatch):
    """The step's numbers stay on the device (the CPU can queue the next step on a GPU): over
    12 steps logged every 4, the trainer copies numbers to the host at steps 0, 4 and 8 and at
    the last (its evaluation and checkpoint), once each, and nowhere else."""
    from longpack import training

    package = str(Path(training.__file__).parent)
    reads = []
    for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            caller = sys._getframe(1).f_code
            if caller.co_filename.startswith(package) and not caller.co_filename.endswith(
                    ("evaluate.py", "checkpoint.py")):
                reads.append(f"{Path(caller.co_filename).name}:{caller.co_name}.{_name}")
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    shards = padded_build(tmp_path, byte_tokenizer)
    history = train(config(shards, tmp_path / "r", max_steps=12, log_every=4, save_every=100,
                           eval_every=100, workers=0), log=lambda m: None)
    assert len(history) == 12
    # and at the checkpoint, the check that the weights it saves are finite (one read)
    assert reads == ["step.py:read_steps.tolist"] * 4 + ["loop.py:check_weights.__bool__"], reads


def test_a_failed_evaluation_leaves_the_model_in_training_mode():
    from longpack.training.evaluate import split_loss

    class Damaged:  # a val split whose second row cannot be read
        def get(self, i):
            if i:
                raise OSError("val shard damaged")
            return np.arange(9), np.array([0]), None  # tokens, document starts, no hashes

    model = archs.build("neox-tiny").train()
    with pytest.raises(OSError, match="damaged"):
        split_loss(model, Damaged(), 2, 1)
    assert model.training


def test_ctrl_c_says_it_stops_after_the_step_and_a_second_stops_at_once():
    """The first Ctrl+C was silent until the step in hand ended, and a second was ignored."""
    import os
    import signal

    from longpack.training.loop import stop_requested

    said = []
    with pytest.raises(KeyboardInterrupt):
        with stop_requested(said.append) as stop:
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.requested and said == [
                "stopping after the step in hand, with a checkpoint (Ctrl+C again to stop at once)"]
            os.kill(os.getpid(), signal.SIGTERM)  # a second signal, of either kind
    assert said[-1].startswith("stopped at once: re-run the same command to resume")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


@pytest.mark.slow
def test_a_val_split_too_small_and_a_half_precision_on_a_cpu_are_said(tmp_path, byte_tokenizer):
    """Both were silent: a val loss of one sample reported as the val loss; bf16 on a CPU
    running slower than fp32."""
    shards = padded_build(tmp_path, byte_tokenizer)
    val_rows = json.loads((shards / "manifest.json").read_text())["splits"]["val"]["rows"]
    said = []
    train(config(shards, tmp_path / "r", max_steps=1, eval_batches=100, precision="bf16",
                 workers=0), log=said.append)
    assert f"{shards.name}: the build's val split holds {val_rows} sample" in "\n".join(said)
    assert "of the 400 an evaluation takes (--eval-batches x --batch-size)" in "\n".join(said)
    assert ("--precision bf16 on a CPU: a CPU without bf16 matrix units emulates it, often "
            "slower than fp32") in said
