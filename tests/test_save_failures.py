"""A save that cannot finish stops in one line naming the cause and the checkpoint a re-run
resumes from, leaves no temporary folder, and never writes, renames or removes anything outside
the run folder: a full disk (a small tmpfs: the first checkpoint does not fit, or the second),
and symlinks at every name a save writes, refused before step 0 when there at the start."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_train_cli import one_line_error

from conftest import run_train_jobs
from longpack.core.errors import TrainingError
from longpack.training.checkpoints import checkpoint, saving
from longpack.training.cli import train as train_cli


def run_cli(shards, run, *more):
    args = ["--shards", shards, "--out", run, "--model", "neox-tiny", "--batch-size", 2,
            "--warmup", 0, "--workers", 0, "--save-every", 1, "--max-steps", 2,
            "--cache", Path(shards).parent / "cache", *more]  # the shard cache off the disk
    return CliRunner().invoke(train_cli, [str(a) for a in args])


def listing(folder: Path) -> dict:
    """Every path under `folder` (links not followed) with its kind, size and mtime."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            out[os.path.relpath(os.path.join(root, name), folder)] = (
                st.st_mode, st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder beside the run that nothing may touch: a file and a folder holding one."""
    where = tmp_path / "outside"
    (where / "folder").mkdir(parents=True)
    (where / "folder" / "kept.txt").write_text("not the run's\n")
    (where / "file.txt").write_text("not the run's either\n")
    return where


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a fresh tmpfs of that size (a small disk that fills up); unmounted after.
    Skips where mounting is not permitted (not root, no CAP_SYS_ADMIN, no mount)."""
    mounted = []

    def mount(size: str) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        if shutil.which("mount") is None:
            pytest.skip("no mount command: the full-disk tests mount a small tmpfs")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"mounting a tmpfs is not permitted here ({r.stderr.strip()}): the "
                        "full-disk tests need root (or CAP_SYS_ADMIN)")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        if subprocess.run(["umount", str(where)]).returncode != 0:
            subprocess.run(["umount", "-l", str(where)])


def resize(disk: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


def no_temporary_folder(run: Path) -> None:
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []


# -- a full disk ---------------------------------------------------------------------------


def test_a_first_checkpoint_that_does_not_fit_stops_in_one_line_to_start_again(tmp_path, shards,
                                                                               tmpfs):
    # 256 KiB: metrics.jsonl fits, a checkpoint of neox-tiny (megabytes) does not
    run = tmpfs("256k") / "run"
    r = run_cli(shards, run, "--max-steps", 1)
    line = one_line_error(r, "the checkpoint of step 1 was not saved", "No space left on device",
                          "free some space", "from the start")
    assert "Traceback" not in r.output and str(run) in line
    no_temporary_folder(run)
    assert list(run.glob("step-*")) == []


def test_a_second_checkpoint_that_does_not_fit_stops_in_one_line_and_the_first_resumes(
        tmp_path, shards, tmpfs, monkeypatch):
    disk = tmpfs("64m")
    run = disk / "run"
    save, saves = saving.save, []

    def second_save_on_a_full_disk(*args, **kwargs):
        saves.append(args[1])
        if len(saves) == 2:  # the disk holds what it holds now and 64 KiB more
            used = shutil.disk_usage(disk).used
            resize(disk, f"{used // 1024 + 64}k")
        return save(*args, **kwargs)

    monkeypatch.setattr(saving, "save", second_save_on_a_full_disk)
    r = run_cli(shards, run)
    first = run / "step-00000001"
    line = one_line_error(r, "the checkpoint of step 2 was not saved", "No space left on device",
                          f"it resumes from {first}")
    assert saves == [1, 2] and "Traceback" not in r.output and "step 1 (" in r.output
    no_temporary_folder(run)
    assert sorted(p.name for p in run.glob("step-*")) == ["step-00000001"], line
    assert checkpoint.is_checkpoint(first) and checkpoint.damage(first) is None
    monkeypatch.setattr(saving, "save", save)
    resize(disk, "64m")  # space freed: the same command resumes from the first checkpoint
    r = run_cli(shards, run)
    assert r.exit_code == 0, r.output
    assert f"resumed from {first} at step 1" in r.output
    assert checkpoint.is_checkpoint(run / "step-00000002")


def test_a_metrics_line_on_a_full_disk_stops_in_one_line(tmp_path, shards, tmpfs, monkeypatch):
    disk = tmpfs("64m")
    run = disk / "run"
    save = saving.save

    def fill_the_disk_after_the_first_save(*args, **kwargs):
        saved = save(*args, **kwargs)
        with open(disk / "filler", "wb", buffering=0) as f:  # every block left
            with pytest.raises(OSError):
                while True:
                    f.write(bytes(1 << 16))
        # metrics.jsonl to the end of its page: its next line needs a block of its own
        metrics = run / "metrics.jsonl"
        metrics.write_bytes(metrics.read_bytes().ljust(4096))
        return saved

    monkeypatch.setattr(saving, "save", fill_the_disk_after_the_first_save)
    r = run_cli(shards, run)
    one_line_error(r, f"cannot write {run / 'metrics.jsonl'}", "No space left on device")
    assert "Traceback" not in r.output and checkpoint.is_checkpoint(run / "step-00000001")


LAUNCH_TIMEOUT = 240  # far past a launch's time: a hang is a failure, not a stuck CI job


@pytest.mark.slow
def test_a_full_disk_stops_every_process_in_one_line_without_a_hang(tmp_path, shards, tmpfs):
    # 2 processes (tests/train_jobs.py, one launch): without --fsdp rank 0 writes alone while
    # rank 1 waits for it; with it each writes its part
    disk = tmpfs("256k")
    jobs = [{"argv": ["--shards", str(shards), "--out", str(disk / name), "--model", "neox-tiny",
                      "--batch-size", "2", "--warmup", "0", "--workers", "0", "--max-steps", "1",
                      "--cache", str(tmp_path / "cache"), *more],
             "stdout": str(tmp_path / name)} for name, more in [("ddp", []), ("fsdp", ["--fsdp"])]]
    run_train_jobs(tmp_path, jobs, timeout=LAUNCH_TIMEOUT)  # a job's traceback ends the launch
    for name in ("ddp", "fsdp"):
        errors = [[line for line in Path(f"{tmp_path / name}.rank{rank}").read_text().splitlines()
                   if line.startswith("Error: ")] for rank in (0, 1)]
        assert [len(e) for e in errors] == [1, 1], (name, errors)
        assert "the checkpoint of step 1 was not saved: No space left on device" in errors[0][0]
        assert "from the start" in errors[0][0]
        assert "the checkpoint of step 1 was not saved" in errors[1][0]
        if name == "fsdp":  # its part did not fit either
            assert "No space left on device" in errors[1][0]
        no_temporary_folder(disk / name)


# -- names the run writes ------------------------------------------------------------------

NAMES = ["step-00000002", ".step-00000002.tmp", ".step-00000001.tmp/COMPLETE", "latest",
         ".latest.tmp4242", "metrics.jsonl", ".metrics.jsonl.tmp4242"]


@pytest.mark.parametrize("target", ["gone", "folder", "file.txt"])
@pytest.mark.parametrize("name", NAMES)
def test_a_symlink_at_a_name_the_run_writes_is_refused_before_step_0(tmp_path, shards, outside,
                                                                    name, target):
    run = tmp_path / "runs" / "run"
    link = run / name
    link.parent.mkdir(parents=True)  # a save cut short left .step-00000001.tmp
    link.symlink_to(outside / target)
    before, run_before = listing(outside), listing(run)
    r = run_cli(shards, run)
    one_line_error(r, f"{link} is a symlink (to {outside / target})", "remove it")
    assert "training" not in r.output and "Traceback" not in r.output  # no step was trained
    assert listing(outside) == before and not (outside / "gone").exists()
    assert listing(run) == run_before and os.readlink(link) == str(outside / target)


@pytest.mark.parametrize("name, target", [("step-00000002", "gone"),
                                          (".step-00000002.tmp", "folder"), ("latest", "gone")])
def test_a_symlink_planted_while_the_run_trains_stops_its_save_in_one_line(
        tmp_path, shards, outside, monkeypatch, name, target):
    run = tmp_path / "runs" / "run"
    save = saving.save

    def planted_before_the_second_save(*args, **kwargs):
        if args[1] == 2:
            (run / name).unlink(missing_ok=True)  # `latest`, a file since the first save
            (run / name).symlink_to(outside / target)
        return save(*args, **kwargs)

    monkeypatch.setattr(saving, "save", planted_before_the_second_save)
    before = listing(outside)
    r = run_cli(shards, run)
    one_line_error(r, "the checkpoint of step 2 was not saved", f"{run / name} is a symlink",
                   f"it resumes from {run / 'step-00000001'}")
    assert "Traceback" not in r.output
    assert listing(outside) == before and not (outside / "gone").exists()
    assert (run / name).is_symlink()  # left as it is, and no temporary folder besides it
    assert [p.name for p in run.iterdir() if p.name.startswith(".") and not p.is_symlink()] == []
    assert sorted(p.name for p in run.glob("step-*")) == ["step-00000001"] + (
        [name] if name.startswith("step-") else [])


def test_a_symlink_planted_at_metrics_jsonl_while_the_run_trains_is_one_line(
        tmp_path, shards, outside, monkeypatch):
    run = tmp_path / "runs" / "run"
    save = saving.save

    def planted_after_the_first_save(*args, **kwargs):
        saved = save(*args, **kwargs)
        if args[1] == 1:
            (run / "metrics.jsonl").rename(run / "kept.jsonl")
            (run / "metrics.jsonl").symlink_to(outside / "gone")
        return saved

    monkeypatch.setattr(saving, "save", planted_after_the_first_save)
    r = run_cli(shards, run)
    one_line_error(r, f"cannot write {run / 'metrics.jsonl'}: ", "move the symlink at that name "
                   "away (nothing is written through one)", "it resumes from its last checkpoint")
    assert not (outside / "gone").exists() and (run / "metrics.jsonl").is_symlink()


@pytest.mark.parametrize("name, kind", [("latest", "folder"), ("metrics.jsonl", "folder"),
                                        (".step-00000002.tmp", "file")])
def test_something_else_at_a_name_the_run_writes_is_refused_before_step_0(tmp_path, name, kind):
    """Before: a folder at `latest` or a file at a save's temporary name failed that save,
    after the steps since the last one were trained."""
    run = tmp_path / "run"
    run.mkdir()
    if kind == "folder":
        (run / name).mkdir()
    else:
        (run / name).write_text("a user's")
    wanted = "file" if kind == "folder" else "folder"
    with pytest.raises(TrainingError, match=rf"{run / name} is not a {wanted}, where"):
        saving.check_names(run)
    assert (run / name).exists()


@pytest.mark.parametrize("kind", ["folder", "file", "copy"])
def test_a_foreign_thing_at_a_step_the_run_will_save_is_refused_before_step_0(tmp_path, shards,
                                                                           kind):
    """`--resume never` (a resume refuses a run folder whose checkpoints cannot be read, these
    among them). Before: the run trained to that step, then its save refused the folder there,
    losing the steps since the last checkpoint. A folder at a step past the run's last stays as
    it is (the run never writes there)."""
    run = tmp_path / "runs" / "run"
    run.mkdir(parents=True)
    late = run / "step-00000009"  # past --max-steps 2: not the run's business
    late.mkdir()
    in_the_way = run / "step-00000002"
    if kind == "file":
        in_the_way.write_text("a user's")
    else:
        in_the_way.mkdir()
        if kind == "copy":  # a checkpoint's COMPLETE, of another step: a copy of one
            (in_the_way / "COMPLETE").write_text("longpack checkpoint of step 7\n")
    before = listing(run)
    r = run_cli(shards, run, "--resume", "never")
    one_line_error(r, f"{in_the_way} is where this run would save its checkpoint of step 2",
                   "move it out of the run folder", "no step was trained")
    assert "Traceback" not in r.output
    assert listing(run) == before  # nothing trained, written or removed
    in_the_way.rename(tmp_path / "moved")
    r = run_cli(shards, run, "--resume", "never")
    assert r.exit_code == 0, r.output
    assert late.is_dir() and not any(late.iterdir())


def test_a_leftover_temporary_folder_without_links_is_no_obstacle(tmp_path):
    run = tmp_path / "run"
    (run / ".step-00000004.tmp").mkdir(parents=True)
    (run / ".step-00000004.tmp" / "__0_0.distcp").write_bytes(b"cut short")
    (run / "step-hf").symlink_to(tmp_path)  # not a name the run writes (zoo export's)
    saving.check_names(run)


# -- the run folder itself -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["dangling link", "file", "under a file"])
def test_a_run_folder_that_cannot_be_made_is_refused_before_step_0(tmp_path, shards, outside,
                                                                  how):
    runs = tmp_path / "runs"
    runs.mkdir()
    if how == "dangling link":
        run = runs / "run"
        run.symlink_to(outside / "gone")
        part = f"{run} is a symlink to {outside / 'gone'}, which does not exist"
    elif how == "file":
        run = runs / "run"
        run.write_text("a file\n")
        part = f"{run} is a file, not a folder"
    else:
        (runs / "notes").write_text("a file\n")
        run = runs / "notes" / "run"
        part = f"{runs / 'notes'} is a file, not a folder"
    before = listing(outside)
    r = run_cli(shards, run)
    one_line_error(r, part, "pass another --out")
    assert "training" not in r.output and listing(outside) == before
    assert not (outside / "gone").exists()


def test_a_read_only_run_folder_is_refused_before_step_0(tmp_path, shards, tmpfs):
    disk = tmpfs("1m")
    (disk / "run").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    r = run_cli(shards, disk / "run")
    one_line_error(r, f"{disk / 'run'} cannot be written", "make it writable")
    assert "training" not in r.output
