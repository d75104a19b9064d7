"""`pack build --engine slurm` (pipeline/distribute/engine_slurm.py, slurm_wait.py): the
scripts it writes, its refusals, and real builds on a one-node Slurm
(../shared/tools/slurm_local.sh) that must be byte-identical to the single-machine build, also
when a task fails, is killed or is requeued."""

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import make_texts, write_jsonl
from longpack.core.errors import SettingsError
from longpack.pipeline.build import build
from longpack.pipeline.config import BuildConfig
from longpack.pipeline.distribute.engine_slurm import build_with_slurm, slurm_folder
from longpack.pipeline.distribute.slurm_wait import queue, queued_jobs

POLL_S = 0.3


@pytest.fixture
def settle_briefly(monkeypatch):
    """For a build that fails for good (no task requeued): the second look before the failure
    is named (slurm_wait.SETTLE_S, 5 s, for a requeued task Slurm shows as FAILED for a
    moment) still happens, sooner."""
    monkeypatch.setattr("longpack.pipeline.distribute.slurm_wait.SETTLE_S", POLL_S)


def settings(tmp_path: Path, tokenizer: str, files: int = 6, docs: int = 400, repeat: int = 1,
             **over) -> dict:
    """Settings of a small build over `files` JSONL files (each record repeated `repeat` times,
    to make a task run longer); short rows and small shards, so shards straddle the tasks."""
    corpus = tmp_path / "corpus"
    corpus.mkdir(exist_ok=True)
    texts = make_texts(files * docs)
    for f in range(files):
        write_jsonl(corpus / f"part-{f}.jsonl",
                    [{"text": t} for t in texts[f * docs:(f + 1) * docs]] * repeat)
    return {"dataset": "jsonl", "inputs": (str(corpus / "*.jsonl"),), "tokenizer": tokenizer,
            "seq": 257, "val_fraction": 0.05, "shard_bytes": 257 * 2 * 16, "workers": 1, **over}


def single_build(tmp_path: Path, **kw) -> Path:
    out = tmp_path / "single" / "out"
    build(BuildConfig(out=str(out), **kw), show_progress=False)
    return out


def assert_same_build(single: Path, tasked: Path) -> None:
    """Every file under OUT identical; manifest.json identical apart from "timings"."""
    def files(out):
        return sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())

    assert files(tasked) == files(single)
    for rel in files(single):
        if rel == Path("manifest.json"):
            a, b = (json.loads((o / rel).read_text()) for o in (single, tasked))
            a.pop("timings"), b.pop("timings")
            assert a == b
        else:
            assert (tasked / rel).read_bytes() == (single / rel).read_bytes(), rel


def submitted_jobs(out: Path, timeout: float = 30) -> dict[str, str]:
    """{script name: job id} of the build's jobs, once both are queued."""
    deadline = time.monotonic() + timeout
    while len(jobs := queued_jobs(slurm_folder(out))) < 2:
        assert time.monotonic() < deadline, "the jobs were not submitted"
        time.sleep(0.05)
    return {script: job for job, script in jobs.items()}


def in_background(cfg: BuildConfig, options: tuple[str, ...] = ()) -> tuple[threading.Thread, list]:
    """build_with_slurm(..., wait=True) in a thread, so the test can act on the running jobs."""
    result = []
    thread = threading.Thread(target=lambda: result.append(
        build_with_slurm(cfg, options, wait=True, dry_run=False, poll_s=POLL_S)))
    thread.start()
    return thread, result


def task_process(out: Path, index: int, timeout: float = 60) -> int:
    """The pid of task `index`'s `pack build` process, once it has written some tokens."""
    folder = out / ".longpack-build" / f"task.{index:05d}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            try:
                args = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (str(out).encode() in args and b"--task-index" in args
                    and args[args.index(b"--task-index") + 1] == str(index).encode()
                    and any(f.stat().st_size for f in folder.glob("*.tokens"))):
                return int(proc.name)
        time.sleep(0.02)
    raise AssertionError(f"task {index} never ran with tokens written")


# -- without Slurm ------------------------------------------------------------------------------
def test_dry_run_prints_both_scripts_and_writes_nothing(tmp_path, byte_tokenizer, capsys):
    out = tmp_path / "my build"
    cfg = BuildConfig(out=str(out), tasks=3, **settings(tmp_path, byte_tokenizer, workers=2),
                      overwrite=True)
    assert build_with_slurm(cfg, ("--partition=cpu", "--time=04:00:00"), wait=False,
                            dry_run=True) == 0
    printed = capsys.readouterr().out
    assert not out.exists()
    tasks_part, merge_part = printed.split("\n# " + str(slurm_folder(out) / "merge.sbatch"))
    tasks_lines, merge_lines = tasks_part.splitlines(), merge_part.splitlines()
    for lines, log in ((tasks_lines, "task-%a.log"), (merge_lines, "merge-%a.log")):
        sbatch = [line.removeprefix("#SBATCH ") for line in lines if line.startswith("#SBATCH")]
        assert "--array=0-2" in sbatch and "--requeue" in sbatch
        assert f"--output={shlex.quote(str(slurm_folder(out) / log))}" in sbatch
        # the user's options come last, so they win over longpack's where both set one
        assert sbatch[-2:] == ["--partition=cpu", "--time=04:00:00"]
    tasks_sbatch = [line for line in tasks_lines if line.startswith("#SBATCH")]
    assert "#SBATCH --cpus-per-task=2" in tasks_sbatch
    assert "#SBATCH --job-name='longpack-my build'" in tasks_sbatch
    assert "#SBATCH --kill-on-invalid-dep=yes" in merge_lines
    assert not any("dependency" in line for line in merge_lines if line.startswith("#SBATCH"))

    # The task line gives back the very settings (less --overwrite: the launcher did that).
    (run,) = [line for line in tasks_lines if line.startswith("exec ")]
    args = shlex.split(run.removeprefix("exec "))
    assert Path(args[0]).name == "pack" and args[1] == "build"
    assert args[-5:] == ["--tasks", "3", "--task-index", "$SLURM_ARRAY_TASK_ID", "--no-merge"]
    assert "--overwrite" not in args
    from longpack.pipeline.cli import pack

    params = pack.commands["build"].make_context("build", args[2:-3] + ["--task-index", "1"]
                                                 ).params
    fields = {f.name for f in dataclasses.fields(BuildConfig)}
    again = BuildConfig(**{k: v for k, v in params.items() if k in fields})
    assert again == dataclasses.replace(cfg, task_index=1, overwrite=False)
    (merge_run,) = [line for line in merge_lines if line.startswith("exec ")]
    assert shlex.split(merge_run)[2:] == ["merge", str(out), "--task-index",
                                          "$SLURM_ARRAY_TASK_ID"]


@pytest.mark.parametrize("option, says", [
    ("--array=0-9", "sets --array itself"), ("--dep=afterok:1", "sets --dependency itself"),
    ("-o/tmp/x.log", "sets --output itself"), ("partition=cpu", "one sbatch option"),
    ("--comment=a\n#SBATCH --array=0-1", "one sbatch option")])
def test_options_longpack_owns_or_cannot_use_are_refused(tmp_path, byte_tokenizer, option, says):
    cfg = BuildConfig(out=str(tmp_path / "out"), tasks=2, **settings(tmp_path, byte_tokenizer))
    with pytest.raises(SettingsError, match=says):
        build_with_slurm(cfg, (option,), wait=False, dry_run=True)


def test_no_sbatch_is_one_line_and_writes_nothing(tmp_path, byte_tokenizer, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no Slurm on it
    out = tmp_path / "out"
    cfg = BuildConfig(out=str(out), tasks=2, **settings(tmp_path, byte_tokenizer))
    with pytest.raises(SettingsError, match="--engine slurm needs Slurm's sbatch on PATH"):
        build_with_slurm(cfg, (), wait=True, dry_run=False)
    assert not out.exists()


def test_pack_build_engine_slurm_from_the_command_line(tmp_path, byte_tokenizer, monkeypatch):
    from click.testing import CliRunner

    from longpack.pipeline.cli import pack

    kw = settings(tmp_path, byte_tokenizer)
    args = ["build", "--out", str(tmp_path / "out"), "--dataset", "jsonl", "--input",
            kw["inputs"][0], "--tokenizer", byte_tokenizer, "--tasks", "2", "--engine", "slurm"]
    dry = CliRunner().invoke(pack, [*args, "--dry-run", "--slurm-option", "--time=01:00:00"])
    assert dry.exit_code == 0, dry.output
    assert "#SBATCH --array=0-1" in dry.output and "#SBATCH --time=01:00:00" in dry.output
    monkeypatch.setenv("PATH", str(tmp_path))
    no_slurm = CliRunner().invoke(pack, [*args, "--wait"])
    assert no_slurm.exit_code == 1
    assert no_slurm.output.startswith("Error: --engine slurm needs Slurm's sbatch on PATH")
    assert no_slurm.output.count("\n") == 1  # one line, no traceback


# -- on a real one-node Slurm -------------------------------------------------------------------
@pytest.mark.slow
def test_sbatch_refusal_is_its_own_words_and_submits_nothing(slurm, tmp_path, byte_tokenizer):
    cfg = BuildConfig(out=str(tmp_path / "out"), tasks=2, **settings(tmp_path, byte_tokenizer))
    with pytest.raises(SettingsError, match="sbatch refused tasks.sbatch: .*invalid partition"):
        build_with_slurm(cfg, ("--partition=nosuch",), wait=True, dry_run=False)
    assert queued_jobs(slurm_folder(cfg.out)) == {}


@pytest.mark.slow
@pytest.mark.parametrize("tasks, fmt, packing", [(2, "mds", "concat"), (3, "memmap", "concat"),
                                                 (3, "mds", "best-fit"),
                                                 (2, "memmap", "best-fit")])
def test_slurm_build_is_byte_identical(slurm, tmp_path, byte_tokenizer, capsys, tasks, fmt,
                                       packing):
    kw = settings(tmp_path, byte_tokenizer, format=fmt, packing=packing)
    out = tmp_path / "slurm" / "out"
    cfg = BuildConfig(out=str(out), tasks=tasks, **kw)
    assert build_with_slurm(cfg, (), wait=True, dry_run=False, poll_s=POLL_S) == 0
    printed = capsys.readouterr().out
    assert re.search(r"submitted tasks job \d+ .* merge job \d+", printed)
    assert f"pack build: {out}" in printed  # the summary, once finished
    assert_same_build(single_build(tmp_path, **kw), out)
    assert not (out / ".longpack-build").exists()
    # the same command again finds the build complete and submits nothing
    assert build_with_slurm(cfg, (), wait=True, dry_run=False, poll_s=POLL_S) == 0
    assert "already complete" in capsys.readouterr().out
    assert not (out / ".longpack-build").exists()


@pytest.mark.slow
def test_slurm_build_into_s3_is_the_single_build(slurm, s3, tmp_path, byte_tokenizer, capsys):
    """Jobs get the submitter's environment (sbatch's default): the endpoint and credentials of
    the bucket; the tasks stage in --staging, which every job sees."""
    kw = settings(tmp_path, byte_tokenizer)
    cfg = BuildConfig(out=s3.url("slurm"), tasks=2, staging=str(tmp_path / "staging"), **kw)
    assert build_with_slurm(cfg, (), wait=True, dry_run=False, poll_s=POLL_S) == 0
    single = single_build(tmp_path, **kw)
    objects = {key.removeprefix("slurm/"): s3.read(key) for key in s3.keys("slurm/")}
    a, b = (json.loads(m) for m in (objects.pop("manifest.json"),
                                    (single / "manifest.json").read_bytes()))
    assert a.pop("timings") and b.pop("timings") and a == b
    assert objects == {str(p.relative_to(single)): p.read_bytes() for p in single.rglob("*")
                       if p.is_file() and p.name != "manifest.json"}
    printed = capsys.readouterr().out
    assert "already complete" not in printed and f"pack build: {cfg.out}  (mds" in printed
    assert build_with_slurm(cfg, (), wait=True, dry_run=False, poll_s=POLL_S) == 0
    assert "already complete" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("kill_on_invalid_dep", ["yes", "no"])
def test_failed_task_exits_1_naming_it_and_its_log(slurm, settle_briefly, tmp_path, byte_tokenizer,
                                                     capsys, kill_on_invalid_dep):
    """With "no" the merge job stays pending (DependencyNeverSatisfied): --wait cancels it."""
    kw = settings(tmp_path, byte_tokenizer, files=2, on_error="fail")
    with open(tmp_path / "corpus" / "part-1.jsonl", "ab") as f:
        f.write(b'{"text": "cut off\n')
    cfg = BuildConfig(out=str(tmp_path / "out"), tasks=2, **kw)
    option = (f"--kill-on-invalid-dep={kill_on_invalid_dep}",)
    assert build_with_slurm(cfg, option, wait=True, dry_run=False, poll_s=POLL_S) == 1
    err = capsys.readouterr().err
    log = slurm_folder(cfg.out) / "task-1.log"
    assert f"task 1 FAILED (log {log}: Error: " in err and "part-1.jsonl" in err
    assert "task 0" not in err and "merge job" in err and "cancelled" in err
    assert queued_jobs(slurm_folder(cfg.out)) == {}  # nothing left waiting forever
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.slow
def test_requeued_task_resumes_and_the_build_is_identical(slurm, tmp_path, byte_tokenizer):
    kw = settings(tmp_path, byte_tokenizer, files=2, docs=2000, repeat=8)
    out = tmp_path / "slurm" / "out"
    cfg = BuildConfig(out=str(out), tasks=2, **kw)
    thread, result = in_background(cfg)
    job = submitted_jobs(out)["tasks.sbatch"]
    task_process(out, 1)  # running, partway
    # A second submission of the same build while its jobs run would run each task twice.
    with pytest.raises(SettingsError, match="already being built by Slurm job"):
        build_with_slurm(cfg, (), wait=False, dry_run=False)
    subprocess.run(["scontrol", "requeue", f"{job}_1"], check=True)
    # Slurm holds a requeued job back ~2 minutes (BeginTime); let it start again now. Slurm
    # 22.05 here records some requeues of an element that started a moment ago as FAILED
    # (NonZeroExitCode) instead (about 1 run in 3 of this test): then --wait names the task and
    # the same command resumes it; both ways must end in the same bytes.
    deadline = time.monotonic() + 60
    while (state := queue([job]).get((job, 1), ("", ""))) not in (("PENDING", "BeginTime"),
                                                                   ("FAILED", "NonZeroExitCode")):
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    log = slurm_folder(out) / "task-1.log"
    if state[0] == "PENDING":
        # Not at once: an element started again within a moment of its requeue may fail to
        # launch (the last attempt's step still being cleaned up), which a real cluster's two
        # minutes of BeginTime never meet.
        time.sleep(2)
        subprocess.run(["scontrol", "update", f"jobid={job}_1", "starttime=now"], check=True)
        while "attempt 2 " not in log.read_text():  # the merge removes the log once it is done
            assert time.monotonic() < deadline and thread.is_alive(), log.read_text()
            time.sleep(0.02)
        assert "DUE TO JOB REQUEUE" in log.read_text()
        thread.join(timeout=300)
        assert result == [0]
    else:
        thread.join(timeout=300)
        assert result == [1] and "DUE TO JOB REQUEUE" in log.read_text()
        assert build_with_slurm(cfg, (), wait=True, dry_run=False, poll_s=POLL_S) == 0
    assert_same_build(single_build(tmp_path, **kw), out)


@pytest.mark.slow
def test_killed_task_fails_then_rerun_finishes_identical(slurm, settle_briefly, tmp_path,
                                                        byte_tokenizer, capsys):
    kw = settings(tmp_path, byte_tokenizer, files=2, docs=2000, repeat=8)
    out = tmp_path / "slurm" / "out"
    cfg = BuildConfig(out=str(out), tasks=2, **kw)
    thread, result = in_background(cfg)
    os.kill(task_process(out, 0), signal.SIGKILL)
    thread.join(timeout=300)
    assert result == [1]
    err = capsys.readouterr().err
    assert f"task 0 FAILED (log {slurm_folder(out) / 'task-0.log'}" in err
    # the same command again resumes task 0 and skips the finished task 1
    assert build_with_slurm(cfg, (), wait=True, dry_run=False, poll_s=POLL_S) == 0
    assert_same_build(single_build(tmp_path, **kw), out)
