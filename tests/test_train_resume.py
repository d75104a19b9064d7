"""The trainer's checkpoints: exact resume (also from a checkpoint of the previous format, and
after a signal), refusals of what does not fit, fallback past a damaged checkpoint, metrics.jsonl
after a crash."""

import json

import pytest
import torch
from click.testing import CliRunner
from test_train import config, records, weights

from longpack.core.errors import TrainingError
from longpack.training.checkpoints import checkpoint
from longpack.training.cli import train as train_cli
from longpack.training.loop import train


@pytest.mark.slow
def test_resume_is_exact(tmp_path, shards):
    straight = train(config(shards, tmp_path / "a"), log=lambda m: None)
    train(config(shards, tmp_path / "b"), log=lambda m: None, stop_at=5)  # interrupted
    resumed = train(config(shards, tmp_path / "b"), log=lambda m: None)  # resumes at step 5
    assert [h["loss"] for h in straight] == [h["loss"] for h in resumed]
    assert [h["batch"] for h in straight] == [h["batch"] for h in resumed]
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # The run's history is metrics.jsonl, the same as straight; no checkpoint holds a copy
    # that grows with the run, and what train returns is that file, steps before the resume
    # included.
    assert records(tmp_path / "b") == records(tmp_path / "a")
    assert resumed == records(tmp_path / "b", drop=())
    state, _ = checkpoint.load_latest(tmp_path / "b")
    assert state["format"] == checkpoint.FORMAT and "history" not in state
    assert [n for n, _ in state["recent_hashes"]] == list(range(8))
    assert [h for _, h in state["recent_hashes"]] == [h["batch"] for h in straight]


def as_previous_format(path, run, cfg):
    """Rewrite the one-process checkpoint in `path` as longpack wrote them before FORMAT 2: the
    model and the optimizers in state.pt (torch.save, the optimizer state by position), no
    "format", and the metrics records of every step before it in "history"."""
    from longpack import archs
    from longpack.core.atomic import sha256_file
    from longpack.training.checkpoints.checkpoint import load_into
    from longpack.training.optim import make_optimizers

    state = torch.load(path / "state.pt", weights_only=False)
    model = archs.build(cfg.model, **state["model_config"])
    optimizers = make_optimizers(model, cfg)
    load_into(path, model, optimizers, state.pop("param_groups"), distributed=False)
    del state["format"]
    state.update(model=model.state_dict(), optimizers=[o.state_dict() for o in optimizers],
                 history=[r for r in records(run, drop=()) if r["step"] < state["step"]])
    for part in [path / ".metadata", *path.glob("*.distcp")]:
        part.unlink()
    torch.save(state, path / "state.pt")
    (path / "COMPLETE").write_text(sha256_file(path / "state.pt") + "\n")


@pytest.mark.slow
def test_a_checkpoint_of_the_previous_format_resumes_exactly(tmp_path, shards):
    straight = train(config(shards, tmp_path / "a", max_steps=4, workers=0), log=lambda m: None)
    run = tmp_path / "b"
    cfg = config(shards, run, max_steps=4, workers=0)
    train(cfg, log=lambda m: None, stop_at=2)
    as_previous_format(run / "step-00000002", run, cfg)
    said = []
    resumed = train(config(shards, run, max_steps=4, workers=0), log=said.append)
    assert "resumed from" in said[0] and "at step 2" in said[0]
    assert [h["loss"] for h in resumed] == [h["loss"] for h in straight]
    a, b = weights(tmp_path / "a"), weights(run)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert records(run) == records(tmp_path / "a")


@pytest.mark.slow
def test_a_checkpoint_of_a_newer_format_is_refused_not_skipped(tmp_path, shards):
    run = tmp_path / "r"
    train(config(shards, run, max_steps=2, save_every=1, workers=0), log=lambda m: None)
    newest = run / "step-00000002"
    state = torch.load(newest / "state.pt", weights_only=False)
    torch.save({**state, "format": checkpoint.FORMAT + 1}, newest / "state.pt")
    from longpack.core.atomic import sha256_file

    (newest / "COMPLETE").write_text(sha256_file(newest / "state.pt") + "\n")
    # the one before is sound, but falling back to it would quietly undo a step
    r = CliRunner().invoke(train_cli, ["--shards", str(shards), "--out", str(run),
                                       "--max-steps", "3", "--batch-size", "4"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert (f"Error: {newest} was written by a newer longpack (checkpoint format "
            f"{checkpoint.FORMAT + 1}, this one reads up to {checkpoint.FORMAT}); upgrade "
            "longpack to resume it, or pass --resume never or another --out") in r.output


@pytest.mark.slow
def test_a_corrupt_latest_checkpoint_falls_back_to_the_one_before(tmp_path, shards):
    run = tmp_path / "r"
    train(config(shards, run, max_steps=6), log=lambda m: None)  # checkpoints at 3 and 6
    (run / "step-00000006" / "state.pt").write_bytes(b"truncated")
    said = []
    state, path = checkpoint.load_latest(run, said.append)
    assert path.name == "step-00000003" and state["step"] == 3
    assert len(said) == 1 and said[0].startswith(f"skipping checkpoint {run / 'step-00000006'}:")
    # the trainer says it once, in its own log, and resumes from the one before
    lines = []
    train(config(shards, run, max_steps=7), log=lines.append)
    assert [m for m in lines if "skipping checkpoint" in m] == said
    assert f"resumed from {run / 'step-00000003'} at step 3" in lines


@pytest.mark.slow
def test_other_shards_are_refused(tmp_path, shards, byte_tokenizer):
    train(config(shards, tmp_path / "r", max_steps=3), log=lambda m: None)
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["fingerprint"]["settings"]["seed"] = 99  # as if built with another seed
    (shards / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TrainingError, match="trained on other shards"):
        train(config(shards, tmp_path / "r", max_steps=6), log=lambda m: None)


@pytest.mark.slow
def test_another_seed_or_global_batch_is_refused_with_the_numbers_and_the_fix(tmp_path, shards):
    """Each used to be "resume check failed ... (seed or global batch changed?)"."""
    train(config(shards, tmp_path / "r", max_steps=3), log=lambda m: None)
    with pytest.raises(TrainingError, match=r"was trained with --seed 0 and this run has 5: .*"
                                            r"pass --seed 0 or --resume never"):
        train(config(shards, tmp_path / "r", max_steps=6, seed=5), log=lambda m: None)
    bs = config(shards, tmp_path / "r").batch_size
    with pytest.raises(TrainingError) as e:
        train(config(shards, tmp_path / "r", max_steps=6, grad_accum=2), log=lambda m: None)
    assert (f"was trained on {bs} rows a step ({bs} x 1 x 1 processes: --batch-size x "
            f"--grad-accum x processes) and this run takes {2 * bs} ({bs} x 2 x 1); pass "
            "--grad-accum 1, or --resume never") in str(e.value)
    # the same global batch cut otherwise continues (the elastic resume)
    if bs % 2 == 0:
        history = train(config(shards, tmp_path / "r", max_steps=4, batch_size=bs // 2,
                               grad_accum=2), log=lambda m: None)
        assert history[-1]["step"] == 3


@pytest.mark.slow
def test_a_signal_finishes_the_step_saves_and_the_resumed_run_matches(tmp_path, shards):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    args = ["--shards", str(shards), "--batch-size", "4", "--max-steps", "60", "--warmup", "2",
            "--lr", "3e-3", "--save-every", "1000", "--log-every", "1000"]
    # the console script beside this Python; where the package is not installed (the GPU
    # suite's machine) the same command through the interpreter
    installed = Path(sys.executable).parent / "train"
    run = ([str(installed)] if installed.exists()
           else [sys.executable, "-c", "from longpack.training.cli import train; train()"])
    straight = subprocess.run([*run, *args, "--out", str(tmp_path / "a")], check=True,
                              capture_output=True, text=True, timeout=300)
    assert "done: step 60" in straight.stdout
    # Its own process group, signalled whole as a terminal's Ctrl+C or a scheduler would: the
    # loader's worker processes get the signal too.
    proc = subprocess.Popen([*run, *args, "--out", str(tmp_path / "b")],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    metrics = tmp_path / "b" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)  # Ctrl+C (SIGINT) takes the same handler
    out, _ = proc.communicate(timeout=120)
    # 143, as a process killed by SIGTERM: a scheduler sees the run was stopped, not done
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert out.strip().splitlines()[-1].startswith("stopped at step") and "re-run" in out
    stopped_at = checkpoint.load_latest(tmp_path / "b")[0]["step"]
    assert 0 < stopped_at < 60
    subprocess.run([*run, *args, "--out", str(tmp_path / "b")], check=True,
                   capture_output=True, timeout=300)
    a, b = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_metrics_after_a_crash_and_resume_have_each_step_once(tmp_path, shards):
    run = tmp_path / "r"
    train(config(shards, run, max_steps=5, workers=0), log=lambda m: None)  # saves at 3 and 5
    import shutil

    shutil.rmtree(run / "step-00000005")  # as if it crashed after step 5's metrics line
    train(config(shards, run, max_steps=8, workers=0), log=lambda m: None)  # resumes at 3
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(8))
    train(config(shards, run, max_steps=4, workers=0), resume="never", log=lambda m: None)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(4))  # a fresh start in the same --out starts the file again


def test_a_resume_from_a_folder_that_is_no_checkpoint_is_one_line(tmp_path, shards):
    r = CliRunner().invoke(train_cli, ["--shards", str(shards), "--out", str(tmp_path / "r"),
                                       "--resume", str(tmp_path / "nowhere")])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert (f"Error: --resume {tmp_path / 'nowhere'}: no such checkpoint ({tmp_path / 'r'} has "
            "no checkpoints); pass one of them, a checkpoint's path, auto (the newest) or "
            "never") in r.output
    assert not (tmp_path / "r").exists()
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(train_cli, ["--shards", str(shards), "--out", str(tmp_path / "r"),
                                       "--resume", str(tmp_path / "empty")])
    assert (f"Error: --resume {tmp_path / 'empty'}: not a complete checkpoint (no COMPLETE "
            "file); pass a complete checkpoint directory, auto or never") in r.output


def test_resume_by_a_checkpoint_s_name_in_the_run_or_latest(tmp_path, shards, monkeypatch):
    """Before: `--resume step-00000002` or `--resume latest` (names in the run folder, not
    paths from here) said "not a complete checkpoint (no COMPLETE file)"."""
    run = tmp_path / "r"
    train(config(shards, run, max_steps=4, save_every=2, keep_last=5), log=lambda _: None)
    monkeypatch.chdir(tmp_path)  # the names are not paths from here
    said = []
    for name, step in (("step-00000002", 2), ("latest", 4)):
        history = train(config(shards, run, max_steps=4, save_every=2, keep_last=5),
                        resume=name, log=said.append)
        assert f"resumed from {run / f'step-{step:08d}'} at step {step}" in said
        assert len(history) == 4
    said = []  # a resume with a longer run: its decay is stretched, and it says so
    train(config(shards, run, max_steps=6, save_every=2, keep_last=5), log=said.append)
    assert any(line.startswith("the learning-rate schedule differs from the checkpoint's run "
                               "(--max-steps 4 -> 6): from step 4 it follows this run's")
               for line in said), said
    with pytest.raises(TrainingError, match=rf"--resume step-00000008: no such checkpoint "
                       rf"\({run}'s checkpoints: step-00000002, step-00000004, step-00000006\)"):
        train(config(shards, run, max_steps=4), resume="step-00000008", log=lambda _: None)
