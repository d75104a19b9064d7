"""`pack build`'s output safety: it never removes a file it did not write, one writer per --out,
no debris after a kill, one-line errors for a full or read-only disk, Ctrl+C at any moment."""

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import make_texts, signals_as_from_a_shell, write_jsonl
from longpack.core.errors import InputError, SettingsError
from longpack.pipeline.build import build
from longpack.pipeline.cli import pack
from longpack.pipeline.config import WORK_DIR, BuildConfig


@pytest.fixture
def corpus(tmp_path, byte_tokenizer) -> Path:
    return write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(120)])


def settings(tmp_path, corpus, out="out", **kw) -> BuildConfig:
    kw = {"tokenizer": str(tmp_path / "gpt2.tiktoken"), "seq": 64, "val_fraction": 0.2,
          "shard_bytes": 64 * 2 * 4, **kw}
    return BuildConfig(out=str(tmp_path / out), dataset="jsonl", inputs=(str(corpus),), **kw)


def cli_args(tmp_path, corpus, out="out") -> list[str]:
    return ["build", "--dataset", "jsonl", "--input", str(corpus), "--tokenizer",
            str(tmp_path / "gpt2.tiktoken"), "--seq", "64", "--val-fraction", "0.2",
            "--shard-bytes", str(64 * 2 * 4), "--workers", "1", "--out", str(tmp_path / out)]


def tree(out: Path) -> dict[str, bytes]:
    """Every file under `out`, hidden ones included; manifest.json without its timings."""
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
             if p.is_file()}
    files.pop("manifest.json", None)
    return files


# -- 1. a build never removes or replaces a file it did not write -----------------------------

@pytest.mark.parametrize("overwrite", [False, True])
def test_foreign_files_in_split_folders_are_never_removed(tmp_path, corpus, overwrite):
    out = tmp_path / "out"
    (out / "train").mkdir(parents=True)
    (out / "val").mkdir()
    (out / "train" / "notes.txt").write_text("mine")
    with pytest.raises(SettingsError, match=r"not empty and holds no longpack build \(.*"
                                            r"train/notes\.txt is not one of its files"):
        build(settings(tmp_path, corpus, overwrite=overwrite), show_progress=False)
    assert (out / "train" / "notes.txt").read_text() == "mine"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "train", "train/notes.txt", "val"]  # and no debris of the refused build


def test_the_cli_names_the_first_foreign_path_in_one_line(tmp_path, corpus):
    out = tmp_path / "out"
    (out / "val").mkdir(parents=True)
    (out / "val" / "a.txt").write_text("mine")
    r = CliRunner().invoke(pack, cli_args(tmp_path, corpus))
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.output.startswith("Error: ") and len(r.output.strip().splitlines()) == 1
    assert str(out / "val" / "a.txt") in r.output
    assert (out / "val" / "a.txt").exists()


@pytest.mark.slow
def test_overwrite_replaces_a_previous_build_but_never_a_foreign_file(tmp_path, corpus):
    out = tmp_path / "out"
    build(settings(tmp_path, corpus), show_progress=False)
    before = tree(out)
    (out / "val" / "notes.txt").write_text("mine")
    with pytest.raises(SettingsError, match=r"val/notes\.txt is not a file of the longpack build"):
        build(settings(tmp_path, corpus, seq=128, overwrite=True), show_progress=False)
    assert (out / "val" / "notes.txt").read_text() == "mine"
    assert tree(out) == {**before, "val/notes.txt": b"mine"}  # the old build untouched
    (out / "val" / "notes.txt").unlink()
    m = build(settings(tmp_path, corpus, seq=128, overwrite=True), show_progress=False)
    build(settings(tmp_path, corpus, "clean", seq=128), show_progress=False)
    assert m["seq"] == 128 and tree(out) == tree(tmp_path / "clean")  # no old shard is left


def test_an_unfinished_build_with_a_foreign_file_is_not_resumed(tmp_path, corpus, monkeypatch):
    import longpack.pipeline.build as build_mod
    monkeypatch.setattr(build_mod, "CHECKPOINT_SECONDS", 0.0)
    monkeypatch.setattr("longpack.pipeline.read.batches.BATCH_CHARS", 2000)
    with monkeypatch.context() as mp:
        mp.setattr(build_mod.Build, "_finish", lambda self: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            build(settings(tmp_path, corpus), show_progress=False)
    out = tmp_path / "out"
    shard = sorted((out / "train").glob("shard.*"))[0]
    (out / "train" / "extra.bin").write_bytes(b"x")
    with pytest.raises(SettingsError, match=r"train/extra\.bin is not a file of the longpack"):
        build(settings(tmp_path, corpus), show_progress=False)
    with pytest.raises(SettingsError, match=r"train/extra\.bin"):
        build(settings(tmp_path, corpus, overwrite=True), show_progress=False)
    assert shard.exists() and (out / WORK_DIR / "checkpoint.npz").exists()
    (out / "train" / "extra.bin").unlink()
    m = build(settings(tmp_path, corpus), show_progress=False)
    assert m["timings"]["resumed"] and not (out / WORK_DIR).exists()


# -- 2. one writer per --out -------------------------------------------------------------------

PAUSING_BUILD = """
import sys, time
from pathlib import Path
import longpack.pipeline.build as build_mod
import longpack.pipeline.pack.output as output_mod
from longpack.pipeline.cli import pack

ready, go, where = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
owner = build_mod.Build if where == "_consume" else output_mod
original = getattr(owner, where)

def pause_once(*args):
    result = original(*args) if where == "remove_work_files" else None
    if not ready.exists():
        ready.write_text("paused")
        while not go.exists():
            time.sleep(0.02)
    return original(*args) if where == "_consume" else result

setattr(owner, where, pause_once)
pack(sys.argv[4:])
"""


def start_paused(tmp_path, args, where) -> subprocess.Popen:
    """A real `pack build` process that holds the lock, paused in `where` until go is created."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    ready.unlink(missing_ok=True)
    go.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", PAUSING_BUILD, str(ready), str(go), where,
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first build never reached its pause"
        time.sleep(0.02)
    return proc


@pytest.mark.parametrize("where", ["_consume",
                                   pytest.param("remove_work_files", marks=pytest.mark.slow)])
@pytest.mark.slow
def test_a_second_writer_is_refused_at_once_naming_the_first(tmp_path, corpus, where):
    """Paused mid-build, and paused after the work folder is emptied (all but the lock): both
    times a second `pack build` process is refused in one line naming the first one's PID."""
    args = cli_args(tmp_path, corpus)
    first = start_paused(tmp_path, args, where)
    try:
        t0 = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "longpack.pipeline", *args], capture_output=True,
                                text=True, timeout=120)
        assert time.monotonic() - t0 < 30
        assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr
        assert second.stderr.startswith("Error: ") and len(second.stderr.splitlines()) == 1
        assert f"PID {first.pid} " in second.stderr and "another pack build" in second.stderr
    finally:
        (tmp_path / "go").write_text("go")
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    out = tmp_path / "out"
    assert not (out / WORK_DIR).exists()  # no lock file is left behind
    build(settings(tmp_path, corpus, "clean"), show_progress=False)
    assert tree(out) == tree(tmp_path / "clean")


@pytest.mark.slow
def test_the_lock_of_a_killed_build_is_not_stale(tmp_path, corpus):
    args = cli_args(tmp_path, corpus)
    first = start_paused(tmp_path, args, "_consume")
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    out = tmp_path / "out"
    assert (out / WORK_DIR / "lock").exists()
    m = build(settings(tmp_path, corpus), show_progress=False)
    assert m["counts"]["documents"] == 120 and not (out / WORK_DIR).exists()


# -- 3. no orphan temp files after a kill -9 ---------------------------------------------------

KILLED_WHILE_WRITING = """
import os, signal, sys
from pathlib import Path
from longpack.pipeline.cli import pack

target, real_replace = sys.argv[1], os.replace

def replace(src, dst):  # the temp file is complete: die just before it is renamed
    if Path(dst).name == target:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)

os.replace = replace
pack(sys.argv[2:])
"""


@pytest.mark.parametrize("target", ["shard.00002.mds.zstd", "index.json", "manifest.json",
                                    "checkpoint.npz"])
@pytest.mark.slow
def test_a_resumed_build_removes_the_temp_file_of_a_killed_write(tmp_path, corpus, target):
    args = cli_args(tmp_path, corpus)
    killed = subprocess.run([sys.executable, "-c", KILLED_WHILE_WRITING, target, *args],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    out = tmp_path / "out"
    orphans = list(out.rglob(f".{target}.tmp*"))
    assert len(orphans) == 1
    r = CliRunner().invoke(pack, args)  # another process id than the killed one
    assert r.exit_code == 0, r.output
    build(settings(tmp_path, corpus, "clean"), show_progress=False)
    assert tree(out) == tree(tmp_path / "clean")  # hidden files included
    assert not orphans[0].exists()


# -- 4. a full or read-only disk: one line, and the same command resumes ------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A real size-limited tmpfs; `remount(size, read_only)` changes it under the build."""
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(disk)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): needs root/CAP_SYS_ADMIN")

    def remount(size: int, read_only: bool = False):
        subprocess.run(["mount", "-o", f"remount,size={size},{'ro' if read_only else 'rw'}",
                        str(disk)], check=True)

    yield disk, remount
    subprocess.run(["umount", "-l", str(disk)], check=True)


SLOW = pytest.mark.slow


def one_line_error(r) -> str:
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.output.startswith("Error: ") and len(r.output.strip().splitlines()) == 1, r.output
    return r.output


@pytest.mark.parametrize("fraction", [pytest.param(0.1, marks=pytest.mark.slow), 0.5,
                                      pytest.param(0.9, marks=pytest.mark.slow)])
def test_a_full_disk_then_a_read_only_one_end_in_one_line_and_the_build_resumes(
        tmp_path, byte_tokenizer, small_disk, fraction):
    """The disk fills at a different point of the build for each fraction of what it needs."""
    corpus = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(400)])
    disk, remount = small_disk
    args = ["--compression", "none", *cli_args(tmp_path, corpus, str(disk / "out"))[1:]]
    args[args.index("--shard-bytes") + 1] = str(64 * 2 * 32)
    r = CliRunner().invoke(pack, ["build", *args[:-1], str(tmp_path / "clean")])
    assert r.exit_code == 0, r.output
    need = sum(-(-p.stat().st_size // 4096) * 4096 for p in (tmp_path / "clean").rglob("*"))
    remount(int(need * fraction))
    args = ["build", *args]
    full = one_line_error(CliRunner().invoke(pack, args))
    assert f"cannot write {disk / 'out'}" in full and "No space left on device" in full
    assert "re-run the same command" in full
    remount(4 * need, read_only=True)
    read_only = one_line_error(CliRunner().invoke(pack, args))
    assert f"cannot write {disk / 'out'}" in read_only and "Read-only file system" in read_only
    remount(4 * need)
    r = CliRunner().invoke(pack, args)
    assert r.exit_code == 0, r.output
    assert tree(disk / "out") == tree(tmp_path / "clean")


@pytest.mark.parametrize("error", [errno.ENOSPC, pytest.param(errno.EROFS, marks=SLOW)])
@pytest.mark.parametrize("call,at", [
    pytest.param("replace", "first", marks=SLOW), ("replace", "middle"),
    pytest.param("replace", "last", marks=SLOW), pytest.param("fsync", "first", marks=SLOW),
    pytest.param("fsync", "last", marks=SLOW)])
@pytest.mark.slow
def test_a_write_failing_at_any_step_is_one_line_and_the_build_resumes(
        tmp_path, corpus, monkeypatch, call, at, error):
    """The k-th rename into place (the fingerprint first, shards and checkpoints, manifest.json
    last) or fsync (the journal first, manifest.json last) fails as a full or read-only disk's
    would."""
    real, calls = getattr(os, call), []

    def failing(*args):
        calls.append(args)
        if len(calls) == k:
            raise OSError(error, os.strerror(error))
        return real(*args)

    args = cli_args(tmp_path, corpus)
    k = 0
    with monkeypatch.context() as mp:
        mp.setattr(os, call, failing)
        assert CliRunner().invoke(pack, args[:-1] + [str(tmp_path / "clean")]).exit_code == 0
    k = {"first": 1, "middle": len(calls) // 2, "last": len(calls)}[at]
    calls.clear()
    with monkeypatch.context() as mp:
        mp.setattr(os, call, failing)
        message = one_line_error(CliRunner().invoke(pack, args))
    # The build stops at the failing call; only the shard the writer thread is writing at that
    # moment may still reach the disk (a resume writes it again, claimed and identical).
    assert k <= len(calls) <= k + 1
    assert f"cannot write {tmp_path / 'out'}" in message and os.strerror(error) in message
    r = CliRunner().invoke(pack, args)
    assert r.exit_code == 0, r.output
    assert tree(tmp_path / "out") == tree(tmp_path / "clean")


# -- 5. Ctrl+C at any moment, the first second included ----------------------------------------

@pytest.mark.parametrize("after_import", [pytest.param("click", marks=SLOW), "numpy",
                                          pytest.param("longpack.pipeline.build", marks=SLOW),
                                          pytest.param("tiktoken", marks=SLOW)])
@pytest.mark.slow
def test_ctrl_c_in_the_first_second_exits_130_with_the_resume_hint(tmp_path, byte_tokenizer,
                                                                   after_import):
    """A real SIGINT, sent as soon as the child reports (-X importtime) that it has imported a
    module: while it loads the command line, parses flags, imports the pipeline, loads the
    tokenizer. Each time: exit 130, one hint, no traceback, and the same command then builds."""
    corpus = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(300)])
    args = cli_args(tmp_path, corpus)
    child = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "longpack.pipeline", *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=signals_as_from_a_shell)
    seen = []
    for line in child.stderr:
        seen.append(line)
        if line.rsplit("|", 1)[-1].strip() == after_import:
            child.send_signal(signal.SIGINT)
            break
    _, rest = child.communicate(timeout=120)
    said = [line for line in ("".join(seen) + rest).splitlines()
            if line and not line.startswith("import time:")]
    assert child.returncode == 130, said
    assert len(said) == 1 and said[0].startswith("interrupted"), said  # no traceback either
    assert "re-run the" in said[0]
    r = CliRunner().invoke(pack, args + ["--quiet"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "manifest.json").exists()


# -- 6. re-running a finished build says so -----------------------------------------------------

def test_rerunning_a_finished_build_says_it_is_already_complete(tmp_path, corpus):
    args = cli_args(tmp_path, corpus)
    first = CliRunner().invoke(pack, args)
    assert first.exit_code == 0 and "already complete" not in first.output, first.output
    manifest = (tmp_path / "out" / "manifest.json").read_bytes()
    again = CliRunner().invoke(pack, args)
    assert again.exit_code == 0, again.output
    lines = again.output.splitlines()
    assert lines[0].startswith(f"pack build: {tmp_path / 'out'} is already complete (finished ")
    assert "nothing to do" in lines[0] and "--overwrite rebuilds it" in lines[0]
    assert lines[1:] == first.output.splitlines()  # that build's summary, as it was
    assert (tmp_path / "out" / "manifest.json").read_bytes() == manifest
    assert CliRunner().invoke(pack, args + ["--quiet"]).output == ""


# -- 7. settings whose MDS shards would overflow 32-bit offsets are refused up front -------------

def worst_mds_shard(seq: int, itemsize: int, rows: int, shard_bytes: int) -> int:
    """A raw MDS shard's size when every token is a document of its own, from the layout in
    docs/FORMAT.md: u32 n, u32 offsets[n+1], the config, then per sample two u32 sizes, the
    doc_hashes and doc_starts vectors (a dtype byte, the length, the values) and the tokens."""
    import json

    from longpack.pipeline.formats.mds_write import shard_config
    config = json.dumps(shard_config(seq, f"uint{8 * itemsize}", "zstd", shard_bytes),
                        sort_keys=True)
    width = 1 if seq < 256 else 2 if seq < 65536 else 4
    sample = 4 + 4 + (1 + width + 8 * seq) + (1 + width + 4 * seq) + itemsize * seq
    return 4 + 4 * (rows + 1) + len(config) + rows * sample


def test_the_worst_case_bound_is_what_the_encoder_writes():
    import numpy as np

    from longpack.pipeline.formats.mds_write import encode_raw_shard, max_raw_shard_bytes, shard_config
    for seq in (40, 300):
        rows = np.arange(3 * seq, dtype=np.uint32).reshape(3, seq)
        segments = np.array([(r, p, 7) for r in range(3) for p in range(seq)], np.uint64)
        config = shard_config(seq, "uint32", "zstd", 1 << 26)
        raw = encode_raw_shard(rows, segments, config)
        assert len(raw) == max_raw_shard_bytes(seq, 4, 3, config)
        assert len(raw) == worst_mds_shard(seq, 4, 3, 1 << 26)


def test_a_seq_whose_rows_overflow_mds_offsets_is_refused_naming_the_largest(tmp_path):
    r = CliRunner().invoke(pack, ["build", "--seq", "2147483648", "--input", str(tmp_path),
                                  "--out", str(tmp_path / "out")])
    message = one_line_error(r)
    assert "--seq 2,147,483,648 is too long for MDS" in message
    largest = int(message.split("the largest --seq is ")[1].split(" ")[0].replace(",", ""))
    shard_bytes = 1 << 26  # one row per shard at these lengths
    assert worst_mds_shard(largest, 4, 1, shard_bytes) <= 2**32 - 1
    assert worst_mds_shard(largest + 1, 4, 1, shard_bytes) > 2**32 - 1
    BuildConfig(out=str(tmp_path), seq=largest)
    with pytest.raises(SettingsError, match=f"the largest --seq is {largest:,}"):
        BuildConfig(out=str(tmp_path), seq=largest + 1)
    BuildConfig(out=str(tmp_path), seq=2147483648, format="memmap")
    with pytest.raises(SettingsError, match="--seq .* document starts are uint32.* 4,294,967,296"):
        BuildConfig(out=str(tmp_path), seq=2**32 + 1, format="memmap")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("seq", [32768, 1000])
def test_shard_bytes_that_overflow_mds_offsets_are_refused_naming_the_largest(tmp_path, seq):
    with pytest.raises(SettingsError, match="--shard-bytes 8,589,934,592 is too large") as e:
        BuildConfig(out=str(tmp_path), seq=seq, shard_bytes=1 << 33)
    largest = int(str(e.value).split("the largest --shard-bytes is ")[1].replace(",", ""))
    for itemsize in (2, 4):  # 2-byte tokens give more rows per shard: the tighter bound
        rows = largest // (seq * itemsize)
        assert worst_mds_shard(seq, itemsize, rows, largest) <= 2**32 - 1
    assert worst_mds_shard(seq, 2, (largest + 1) // (seq * 2), largest + 1) > 2**32 - 1
    BuildConfig(out=str(tmp_path), seq=seq, shard_bytes=largest)
    with pytest.raises(SettingsError, match=f"the largest --shard-bytes is {largest:,}"):
        BuildConfig(out=str(tmp_path), seq=seq, shard_bytes=largest + 1)
    BuildConfig(out=str(tmp_path), seq=seq, shard_bytes=1 << 33, format="memmap")


def test_an_out_inside_an_input_folder_is_refused_before_anything_is_written(tmp_path,
                                                                           byte_tokenizer):
    """Built once, its own skipped.jsonl, index.json, ... became input of the next run, which
    then could neither resume nor find it complete."""
    folder = tmp_path / "in"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", [{"text": t} for t in make_texts(50)])
    cfg = BuildConfig(out=str(folder / "out"), dataset="jsonl", inputs=(str(folder),),
                      tokenizer=byte_tokenizer, seq=65)
    with pytest.raises(SettingsError, match=f"--out {folder / 'out'} is inside --input "
                                            f"{folder}, which the build reads"):
        build(cfg, show_progress=False)
    assert sorted(p.name for p in folder.iterdir()) == ["a.jsonl"]
    # a glob that does not reach into OUT is the usual layout: built, and found complete again
    glob = BuildConfig(out=str(folder / "out"), dataset="jsonl",
                       inputs=(str(folder / "*.jsonl"),), tokenizer=byte_tokenizer, seq=65)
    first = build(glob, show_progress=False)
    assert build(glob, show_progress=False)["fingerprint"] == first["fingerprint"]


def test_an_input_folder_without_data_files_says_so_first(tmp_path, byte_tokenizer):
    """What is wrong with --input itself is said before where --out lies."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "notes.txt").write_text("no jsonl here")
    cfg = BuildConfig(out=str(folder / "out"), dataset="jsonl", inputs=(str(folder),),
                      tokenizer=byte_tokenizer, seq=65)
    with pytest.raises(SettingsError, match=f"--input {folder}: no jsonl files there"):
        build(cfg, show_progress=False)


def test_a_build_that_packs_no_document_is_an_error_not_an_empty_build(tmp_path,
                                                                      byte_tokenizer):
    """A misspelt --text-field skipped every record and exited 0 with an empty build."""
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in make_texts(30)])
    for tasks, log in ((1, "skipped.jsonl"), (2, ".longpack-build/task.*/skipped.jsonl")):
        out = tmp_path / f"out{tasks}"
        r = CliRunner().invoke(pack, ["build", "--dataset", "jsonl", "--input", str(corpus),
                                      "--tokenizer", byte_tokenizer, "--text-field", "body",
                                      "--out", str(out), "--tasks", str(tasks), "--quiet"])
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
        assert r.output.strip().splitlines()[-1] == (
            f"Error: no document packed: all 30 records were skipped (30 missing_text; "
            f"{out / log} lists them); check --text-field and --dataset (no manifest written)")
        assert not (out / "manifest.json").exists()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")  # no record at all: nothing that looks like a build either
    for packing in ("best-fit", "concat"):
        out = tmp_path / f"e-{packing}"
        with pytest.raises(InputError, match=r"^the inputs hold no record \(empty files\): "
                           r"nothing to pack; check --input \(no manifest written\)$"):
            build(BuildConfig(out=str(out), dataset="jsonl", inputs=(str(empty),),
                              tokenizer=byte_tokenizer, seq=65, packing=packing),
                  show_progress=False)
        assert not (out / "manifest.json").exists()
    r = CliRunner().invoke(pack, ["build", "--dataset", "jsonl", "--input", str(empty),
                                  "--tokenizer", byte_tokenizer, "--out", str(tmp_path / "c"),
                                  "--tasks", "3"])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "hold no record" in r.output
    assert not (tmp_path / "c" / "manifest.json").exists()
    with pytest.raises(SettingsError, match="--text-field must name a field or column"):
        BuildConfig(out=str(tmp_path / "t"), text_field="")


def test_a_pipe_as_input_and_a_broken_link_as_out_are_named_for_what_they_are(tmp_path,
                                                                            byte_tokenizer):
    """They were "no such file or directory" and "cannot write .../lock: File exists"."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(SettingsError, match="is neither a file nor a directory"):
        build(BuildConfig(out=str(tmp_path / "o"), dataset="jsonl", inputs=(str(fifo),),
                          tokenizer=byte_tokenizer), show_progress=False)
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(SettingsError, match="is a link to .*nowhere, which does not exist"):
        BuildConfig(out=str(tmp_path / "link"))
    assert not (tmp_path / "o").exists() and not (tmp_path / "nowhere").exists()
