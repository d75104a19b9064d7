"""The trainer's checkpoints in a bucket (a real S3 server, moto's, on 127.0.0.1): uploaded in
the background, COMPLETE last, --keep-last applied there, found again on a fresh machine (a new
staging folder) with bitwise the same continuation; a kill -9 mid-upload falls back to the
newest complete one; bad buckets, endpoints and credentials stop the run before a step."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_train import config, weights

from conftest import make_texts, write_byte_tokenizer_json, write_jsonl
from longpack.core import StorageError, Store, TrainingError
from longpack.training.checkpoints import checkpoint
from longpack.training.checkpoints.upload import RemoteRun
from longpack.training.cli import train as train_cli
from longpack.training.loop import train

QUIET = dict(log=lambda m: None)

PARTS = {"state.pt", "COMPLETE", ".metadata", "__0_0.distcp"}  # a one-process checkpoint's files


def steps_in(s3, prefix: str) -> dict[str, set[str]]:
    """step folder -> its files, in the bucket under `prefix`."""
    found: dict[str, set[str]] = {}
    for key in s3.keys(prefix + "/"):
        rel = key[len(prefix) + 1:]
        if rel.startswith("step-"):
            folder, name = rel.split("/", 1)
            found.setdefault(folder, set()).add(name)
    return found


def fresh_machine(tmp_path, monkeypatch, name: str) -> Path:
    """Another staging root: what a fresh machine has (nothing of the run)."""
    cache = tmp_path / name
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


@pytest.mark.slow
def test_a_run_into_a_bucket_resumes_bitwise_on_a_fresh_machine(tmp_path, shards, s3,
                                                                 monkeypatch):
    straight = train(config(shards, tmp_path / "straight", save_every=2), **QUIET)
    url = s3.url("run")
    cfg = config(shards, url, save_every=2, keep_last=2)
    fresh_machine(tmp_path, monkeypatch, "machine-a")
    train(cfg, stop_at=4, **QUIET)  # preempted after step 4
    assert steps_in(s3, "run") == {f"step-0000000{n}": PARTS for n in (2, 4)}
    assert json.loads(s3.read("run/metrics.jsonl").splitlines()[-1])["step"] == 3

    machine_b = fresh_machine(tmp_path, monkeypatch, "machine-b")
    said = []
    resumed = train(cfg, log=said.append)
    assert any("resumed from" in m and "at step 4" in m for m in said)
    assert [h["loss"] for h in resumed] == [h["loss"] for h in straight]
    assert [h["batch"] for h in resumed] == [h["batch"] for h in straight]
    run_b = next(machine_b.rglob("run"))
    a, b = weights(tmp_path / "straight"), weights(run_b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # --keep-last 2 in the bucket too; the newest there is the end of the run
    assert sorted(steps_in(s3, "run")) == ["step-00000006", "step-00000008"]
    assert s3.read("run/latest") == b"step-00000008\n"
    lines = s3.read("run/metrics.jsonl").decode().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(8))


@pytest.mark.slow
def test_upload_next_to_a_local_out_and_resume_from_a_checkpoint_url(tmp_path, shards, s3):
    run = tmp_path / "run"
    train(config(shards, run, max_steps=4, save_every=2, workers=0, upload=s3.url("r")),
          **QUIET)
    assert sorted(steps_in(s3, "r")) == ["step-00000002", "step-00000004"]
    local = (run / "step-00000004" / "state.pt").read_bytes()
    assert s3.read("r/step-00000004/state.pt") == local
    assert s3.read("r/step-00000004/COMPLETE") == (run / "step-00000004" / "COMPLETE").read_bytes()
    assert s3.read("r/step-00000004/COMPLETE").decode().splitlines()[-1] == \
        "longpack checkpoint of step 4"
    # a checkpoint named by its URL is fetched into the new run and resumed
    other = tmp_path / "other"
    said = []
    train(config(shards, other, max_steps=6, save_every=2, workers=0),
          resume=s3.url("r/step-00000002"), log=said.append)
    assert any("at step 2" in m for m in said)
    assert (other / "step-00000002" / "state.pt").is_file()
    # a fresh run dir whose resume is refused (another model) keeps nothing it fetched
    refused = tmp_path / "refused"
    with pytest.raises(TrainingError, match="holds a neox-tiny model"):
        train(config(shards, refused, model="moe-tiny", workers=0, upload=s3.url("r")), **QUIET)
    assert not refused.exists()


def test_which_checkpoints_go_after_a_save():
    names = [f"step-0000000{n}" for n in (1, 2, 3, 9)]
    # the newest 2 up to the one saved stay; a later one is an abandoned continuation
    assert checkpoint.to_remove(names, "step-00000003", 2) == ["step-00000001", "step-00000009"]
    assert checkpoint.to_remove(names, "step-00000009", 3) == ["step-00000001"]


def _one_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "testing" not in result.output and "Traceback" not in result.output
    return lines[0]


@pytest.mark.slow
def test_bad_bucket_endpoint_or_credentials_stop_the_run_before_a_step(tmp_path, shards, s3,
                                                                       monkeypatch):
    def args(out, *extra):
        return ["--shards", str(shards), "--out", str(out), "--model", "neox-tiny",
                "--max-steps", "2", "--workers", "0", *extra]

    runner = CliRunner()
    line = _one_line(runner.invoke(train_cli, args(tmp_path / "a", "--upload",
                                                   "s3://no-such-bucket/run")))
    assert "the bucket no-such-bucket does not exist" in line
    assert not (tmp_path / "a").exists()
    line = _one_line(runner.invoke(train_cli, args("https://host/run")))
    assert line.startswith("Error: train cannot write to https://host/run")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    line = _one_line(runner.invoke(train_cli, args(tmp_path / "b", "--upload", s3.url("x"))))
    assert "no credentials found" in line
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # refused at once: botocore's retries add ~10 s
    line = _one_line(runner.invoke(train_cli, args(tmp_path / "c", "--upload", s3.url("x"))))
    assert "the endpoint http://127.0.0.1:9 cannot be reached" in line
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
    line = _one_line(runner.invoke(train_cli, args(s3.url("x"), "--upload", s3.url("y"))))
    assert "--upload is for a local --out" in line
    line = _one_line(runner.invoke(train_cli, args(tmp_path / "d", "--staging", "x")))
    assert "--staging is for an --out URL" in line


def test_gs_and_other_stores_through_the_same_layer(tmp_path, shards, monkeypatch):
    """fsspec's in-memory store stands in for gs:// (no GCS server here), through the command
    line in this process; the second machine keeps the run in its own --staging folder."""
    fresh_machine(tmp_path, monkeypatch, "m")
    url = "memory://runs/x"
    args = ["--shards", str(shards), "--out", url, "--model", "neox-tiny", "--batch-size", "4",
            "--save-every", "1", "--keep-last", "1", "--workers", "0", "--log-every", "100",
            "--warmup", "1"]
    runner = CliRunner()
    try:
        first = runner.invoke(train_cli, [*args, "--max-steps", "2"])
        assert first.exit_code == 0, first.output
        assert f"checkpoints uploaded to {url}" in first.output
        store = Store(url)
        assert sorted(store.sizes()) == ["latest", "metrics.jsonl", "step-00000002/.metadata",
                                         "step-00000002/COMPLETE",
                                         "step-00000002/__0_0.distcp", "step-00000002/state.pt"]
        second = runner.invoke(train_cli, [*args, "--max-steps", "3",
                                           "--staging", str(tmp_path / "elsewhere")])
        assert second.exit_code == 0, second.output
        assert "at step 2" in second.output
        assert list((tmp_path / "elsewhere").glob("*/run/step-00000003/COMPLETE"))
        assert sorted(s for s in store.sizes() if s.startswith("step-")) == \
            ["step-00000003/.metadata", "step-00000003/COMPLETE", "step-00000003/__0_0.distcp",
             "step-00000003/state.pt"]
        lines = store.read_bytes("metrics.jsonl").decode().splitlines()
        assert [json.loads(line)["step"] for line in lines] == [0, 1, 2]
    finally:
        Store("memory://runs").remove(list(Store("memory://runs").sizes()))


@pytest.mark.slow
def test_kill_9_mid_upload_resumes_from_the_newest_complete_checkpoint(tmp_path, shards, s3):
    """state.pt of neox-tiny at this vocabulary is ~78 MB: long enough an upload to be killed
    in. Killed once a checkpoint is complete on the local disk and not yet in the bucket."""
    straight = train(config(shards, tmp_path / "straight", max_steps=12, save_every=2,
                            workers=0), **QUIET)
    run = tmp_path / "run"
    args = ["--shards", str(shards), "--out", str(run), "--model", "neox-tiny",
            "--batch-size", "4", "--max-steps", "12", "--warmup", "2", "--lr", "3e-3",
            "--save-every", "2", "--log-every", "100", "--workers", "0",
            "--upload", s3.url("k")]
    proc = subprocess.Popen([sys.executable, "-c", "from longpack.training.cli import train; train()",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline, killed_step = time.monotonic() + 240, None
    while time.monotonic() < deadline and proc.poll() is None:
        up = {s for s, files in steps_in(s3, "k").items() if "COMPLETE" in files}
        local = {p.parent.name for p in run.glob("step-*/COMPLETE")}
        if up and local - up:  # one is up, a later one is being uploaded
            killed_step = max(local - up)
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert killed_step is not None, "no upload in progress was seen: the run ended first"
    complete = sorted(s for s, files in steps_in(s3, "k").items() if "COMPLETE" in files)
    assert killed_step not in complete  # the one cut short is not complete

    fresh = tmp_path / "fresh"
    said = []
    resumed = train(config(shards, fresh, max_steps=12, save_every=2, workers=0,
                           upload=s3.url("k")), log=said.append)
    assert any(f"at step {int(complete[-1][5:])}" in m for m in said), said
    assert [h["loss"] for h in resumed] == [h["loss"] for h in straight]


@pytest.mark.slow
def test_under_torchrun_rank_0_uploads_and_a_fresh_run_resumes(tmp_path, shards, s3):
    from test_train_distributed import torchrun

    torchrun(shards, tmp_path / "two", "--upload", s3.url("ddp"))
    assert sorted(steps_in(s3, "ddp")) == ["step-00000003", "step-00000006"]
    assert s3.read("ddp/step-00000006/state.pt") == \
        (tmp_path / "two" / "step-00000006" / "state.pt").read_bytes()
    out = torchrun(shards, tmp_path / "fresh", "--upload", s3.url("ddp"), "--max-steps", "8")
    assert "resumed from" in out and "at step 6" in out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_machines(shards, machines: list[Path], steps: int, *extra) -> list[str]:
    """`train` as 2 processes of one run (gloo) that share no disk: each has its own working
    directory and a relative --out, as two machines would. Returns each one's output."""
    train_exe = str(Path(sys.executable).parent / "train")
    args = ["--shards", str(shards), "--out", "run", "--model", "neox-tiny", "--batch-size", "2",
            "--max-steps", str(steps), "--warmup", "2", "--lr", "3e-3", "--save-every", "3",
            "--eval-every", "3", "--workers", "0", "--log-every", "1", *extra]
    port, procs = free_port(), []
    for rank, machine in enumerate(machines):
        machine.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([train_exe, *args], cwd=machine, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        outs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    return outs


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def memmap_shards(tmp_path) -> Path:
    """A memmap build: two processes of one run on this machine that each take themselves for
    the first of their machine (LOCAL_RANK 0) would share mosaicml-streaming's shared memory
    names over an MDS build; machines of their own would not."""
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(200)])
    out = tmp_path / "memmap"
    tokenizer = write_byte_tokenizer_json(tmp_path / "bytes-tokenizer.json")
    build(BuildConfig(out=str(out), dataset="jsonl", inputs=(str(tmp_path / "d.jsonl"),),
                      tokenizer=str(tokenizer), seq=65, val_fraction=0.05, format="memmap",
                      compression=None, shard_bytes=65 * 2 * 40), show_progress=False)
    return out


@pytest.mark.slow
def test_a_memmap_build_in_a_bucket_gives_the_rows_of_the_local_folder(tmp_path, memmap_shards,
                                                                       s3):
    """Any format trains from a URL: a memmap build on S3 gives the rows of the same build read
    locally, and a run over it (its loader workers fetching) the same losses."""
    from longpack.pipeline.builds.reader import open_build

    url = s3.upload_tree(memmap_shards, "memmap")
    remote = open_build(url, tmp_path / "cache", "1gb")
    local = open_build(str(memmap_shards), tmp_path / "unused", "1gb")
    assert remote.fingerprint == local.fingerprint
    for got, want in ((remote.train, local.train), (remote.val, local.val)):
        assert len(got) == len(want) > 0
        for i in range(len(want)):
            assert all(np.array_equal(a, b) for a, b in zip(got.get(i), want.get(i)))
    assert not (tmp_path / "unused").exists()  # a local memmap build is read in place


@pytest.mark.slow
def test_a_run_over_a_memmap_build_in_a_bucket_matches_the_local_folder(tmp_path, memmap_shards,
                                                                        s3):
    url = s3.upload_tree(memmap_shards, "memmap")
    runs = [train(config(shards, tmp_path / name, max_steps=3, workers=2, save_every=100),
                  **QUIET) for name, shards in (("local", memmap_shards), ("s3", url))]
    assert [h["loss"] for h in runs[0]] == [h["loss"] for h in runs[1]]
    assert list((tmp_path / "s3" / "shard-cache").rglob("shard.*.tokens.npy"))  # fetched


@pytest.mark.slow
def test_machines_without_a_shared_disk_resume_from_the_same_checkpoint(tmp_path, memmap_shards,
                                                                        s3):
    """Rank 0's newest checkpoint (step 6) never reached the bucket (its COMPLETE is gone, as
    a kill mid-upload leaves it); rank 1 is on a fresh machine and can only fetch step 3.
    Both resume at step 3 and the run continues bitwise as one never interrupted."""
    straight = tmp_path / "straight"
    two_machines(memmap_shards, [straight / "a", straight / "b"], 9)
    a, b = tmp_path / "a", tmp_path / "b"
    two_machines(memmap_shards, [a, b], 6, "--upload", s3.url("r"))
    assert sorted(steps_in(s3, "r")) == ["step-00000003", "step-00000006"]
    assert not (b / "run" / "step-00000003").exists()  # rank 0 saves, on its own disk
    s3.client.delete_object(Bucket=s3.name, Key="r/step-00000006/COMPLETE")

    out_a, _ = two_machines(memmap_shards, [a, tmp_path / "fresh-b"], 9, "--upload", s3.url("r"))
    assert "resuming at step 3, not 6" in out_a, out_a
    assert losses(a / "run") == losses(straight / "a" / "run")
    one, other = weights(straight / "a" / "run"), weights(a / "run")
    assert all(torch.equal(one[k], other[k]) for k in one)
    assert steps_in(s3, "r") == {f"step-0000000{n}": PARTS for n in (3, 6, 9)}


def test_an_upload_that_fails_is_raised_at_the_next_wait_as_one_line(tmp_path, s3):
    run = tmp_path / "run"
    step = run / "step-00000001"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"x" * 1000)
    (step / "COMPLETE").write_text(checkpoint.sha256_file(step / "state.pt") + "\n")
    remote = RemoteRun(s3.url("gone"))  # reached: the bucket is there now
    s3.client.delete_bucket(Bucket=s3.name)
    remote.submit(step, run, keep_last=1)
    with pytest.raises(StorageError, match=f"^checkpoint upload: cannot upload to "
                       f"s3://{s3.name}/gone/step-00000001/state.pt: the bucket {s3.name} "
                       "does not exist") as e:
        remote.wait()
    assert "\n" not in str(e.value)
    remote.wait()  # raised once, not again
