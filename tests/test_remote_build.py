"""pack build --out s3://...: against a real S3 server (moto's, on 127.0.0.1), the bytes of a
local build; a kill -9 mid-upload resumes without sending again what is up; nothing foreign is
touched; bad URLs, credentials, endpoints and buckets end in one line before any work."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import build_tree, make_texts, write_jsonl
from longpack.core.errors import SettingsError
from longpack.core.settings import to_flags
from longpack.core.store import StorageError, Store
from longpack.pipeline.build import build
from longpack.pipeline.cli import pack
from longpack.pipeline.config import BuildConfig
from longpack.pipeline.distribute.launch import LaunchConfig, launch
from longpack.pipeline.store.remote_build import MARKER, RemoteOut
from longpack.pipeline.store.uploader import MAX_STAGED

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def corpus(tmp_path) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    texts = make_texts(300, seed=7)  # ~270 k byte tokens: 35 shards of 60 rows
    for i in range(3):
        records = [{"text": t} for t in texts[i * 100:(i + 1) * 100]]
        if i == 1:
            records.append(b"{not json")  # a skipped record: skipped.jsonl goes up too
        write_jsonl(folder / f"part{i}.jsonl", records)
    return folder


def settings(out, corpus: Path, tokenizer: str, **kw) -> BuildConfig:
    base = dict(out=str(out), dataset="jsonl", inputs=(str(corpus),), tokenizer=tokenizer,
                seq=128, val_fraction=0.1, shard_bytes=128 * 2 * 60, workers=2)
    return BuildConfig(**{**base, **kw})


def bucket_tree(s3, prefix: str) -> dict[str, bytes]:
    """The objects under `prefix` as build_tree gives a local folder's files."""
    local = {key[len(prefix) + 1:]: s3.read(key) for key in s3.keys(prefix + "/")}
    manifest = json.loads(local.pop("manifest.json"))
    manifest.pop("timings")
    local["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return local


def run_remote(cfg: BuildConfig) -> tuple[dict, bool]:
    outcome = launch(cfg, LaunchConfig(), show_progress=False)
    return outcome.manifest, outcome.already_complete


@pytest.mark.parametrize("fmt, packing", [("mds", "concat"), ("memmap", "concat"),
                                          ("mds", "best-fit"), ("memmap", "best-fit")])
@pytest.mark.slow
def test_a_build_into_s3_holds_the_bytes_of_a_local_build(tmp_path, s3, corpus, byte_tokenizer,
                                                          fmt, packing):
    build(settings(tmp_path / "local", corpus, byte_tokenizer, format=fmt, packing=packing),
          show_progress=False)
    cfg = settings(s3.url("ds"), corpus, byte_tokenizer, format=fmt, packing=packing,
                   staging=str(tmp_path / "staging"))
    manifest, complete = run_remote(cfg)
    assert not complete and manifest["splits"]["train"]["shards"] > 5
    assert bucket_tree(s3, "ds") == build_tree(tmp_path / "local")
    assert not any((tmp_path / "staging").iterdir())  # a finished build leaves no staging
    assert not any(k.endswith(MARKER) for k in s3.keys())

    before = s3.keys()
    stamps = {o["Key"]: o["LastModified"] for o in
              s3.client.list_objects_v2(Bucket=s3.name)["Contents"]}
    manifest_again, complete = run_remote(cfg)
    assert complete and manifest_again == manifest and s3.keys() == before
    assert stamps == {o["Key"]: o["LastModified"] for o in
                      s3.client.list_objects_v2(Bucket=s3.name)["Contents"]}
    assert not any((tmp_path / "staging").iterdir())


@pytest.mark.slow
def test_the_staging_disk_holds_a_few_shards_however_slow_the_store(tmp_path, s3, corpus,
                                                                    byte_tokenizer, monkeypatch):
    """The real server made slow (a delay before each upload): the writer waits for the
    uploads instead of filling the staging disk."""
    staging = tmp_path / "staging"
    seen, stop = [0], threading.Event()
    put_file = Store.put_file

    def slow_put_file(self, local, rel):
        time.sleep(0.05)
        put_file(self, local, rel)

    def watch():
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):  # a folder removed while listed
                seen[0] = max(seen[0], sum(1 for _ in staging.rglob("shard.*")))
            time.sleep(0.005)

    monkeypatch.setattr(Store, "put_file", slow_put_file)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        manifest, _ = run_remote(settings(s3.url("slow"), corpus, byte_tokenizer,
                                          staging=str(staging)))
    finally:
        stop.set()
        watcher.join()
    shards = sum(s["shards"] for s in manifest["splits"].values())
    assert shards > 3 * MAX_STAGED
    # queued + the one uploading + the writer's shard waiting to be queued
    assert 0 < seen[0] <= MAX_STAGED + 2


@pytest.mark.slow
def test_kill_9_mid_upload_resumes_to_the_same_bytes_without_sending_again(tmp_path, s3,
                                                                          corpus,
                                                                          byte_tokenizer):
    small_shards = dict(shard_bytes=128 * 2 * 4)  # 500 shards: time to kill it mid-way
    build(settings(tmp_path / "local", corpus, byte_tokenizer, **small_shards),
          show_progress=False)
    cfg = settings(s3.url("killed"), corpus, byte_tokenizer, staging=str(tmp_path / "stg"),
                   **small_shards)
    args = [sys.executable, "-m", "longpack.pipeline.cli", "build", "--quiet", *to_flags(cfg)]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        shards = [k for k in s3.keys("killed/") if "/shard." in k]
        if len(shards) >= 3:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the build ended before it could be killed: make it bigger"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert "killed/manifest.json" not in s3.keys()  # never complete-looking
    assert f"killed/{MARKER}" in s3.keys()
    up = {o["Key"]: (o["LastModified"], o["ETag"]) for o in
          s3.client.list_objects_v2(Bucket=s3.name, Prefix="killed/")["Contents"]
          if "/shard." in o["Key"]}

    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert bucket_tree(s3, "killed") == build_tree(tmp_path / "local")
    after = {o["Key"]: (o["LastModified"], o["ETag"]) for o in
             s3.client.list_objects_v2(Bucket=s3.name, Prefix="killed/")["Contents"]}
    resent = [k for k, v in up.items() if after[k] != v]
    assert not resent, f"sent again: {resent}"
    assert not any((tmp_path / "stg").iterdir())


@pytest.mark.slow
def test_what_the_build_refuses_to_touch_in_the_bucket(tmp_path, s3, corpus, byte_tokenizer):
    s3.client.put_object(Bucket=s3.name, Key="mine/notes.txt", Body=b"a user's file")
    with pytest.raises(SettingsError, match=rf"{s3.url('mine')} is not empty and holds no "
                       rf"longpack build \({s3.url('mine')}/notes.txt is not one of its files\)"):
        run_remote(settings(s3.url("mine"), corpus, byte_tokenizer))
    assert s3.keys("mine/") == {"mine/notes.txt": 13}

    run_remote(settings(s3.url("ds"), corpus, byte_tokenizer, staging=str(tmp_path / "s")))
    with pytest.raises(SettingsError, match=r"holds a build with different settings "
                       r"\(--seq 128 -> 64\); .* --overwrite"):
        run_remote(settings(s3.url("ds"), corpus, byte_tokenizer, seq=64))
    s3.client.put_object(Bucket=s3.name, Key="ds/train/README", Body=b"x")
    with pytest.raises(SettingsError, match=r"ds/train/README is not a file of the longpack "
                       "build"):
        run_remote(settings(s3.url("ds"), corpus, byte_tokenizer, seq=64, overwrite=True))
    s3.client.delete_object(Bucket=s3.name, Key="ds/train/README")
    manifest, _ = run_remote(settings(s3.url("ds"), corpus, byte_tokenizer, seq=64,
                                      overwrite=True, staging=str(tmp_path / "s")))
    build(settings(tmp_path / "local64", corpus, byte_tokenizer, seq=64), show_progress=False)
    assert bucket_tree(s3, "ds") == build_tree(tmp_path / "local64")


def _one_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "testing" not in result.output  # the dummy credentials never show
    return lines[0]


@pytest.mark.slow
def test_bad_urls_credentials_endpoints_and_buckets_are_one_line_before_any_work(
        tmp_path, s3, corpus, byte_tokenizer, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ["build", "--dataset", "jsonl", "--input", str(corpus), "--tokenizer", byte_tokenizer,
            "--seq", "128", "--staging", str(tmp_path / "stg")]
    runner = CliRunner()
    line = _one_line(runner.invoke(pack, [*base, "--out", "https://host/x"]))
    assert line.startswith("Error: pack build cannot write to https://host/x: https:// is not")
    line = _one_line(runner.invoke(pack, [*base, "--out", "s3://no-such-bucket/x"]))
    assert "the bucket no-such-bucket does not exist" in line
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    line = _one_line(runner.invoke(pack, [*base, "--out", s3.url("x")]))
    assert "no credentials found" in line
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # one try says it: botocore's retries back off ~5 s
    line = _one_line(runner.invoke(pack, [*base, "--out", s3.url("x")]))
    assert "the endpoint http://127.0.0.1:9 cannot be reached" in line
    assert sorted(os.listdir(tmp_path)) == ["corpus", "gpt2.tiktoken"]  # no `s3:`, no staging


def test_gs_and_other_fsspec_stores_go_through_the_same_layer(tmp_path, corpus, byte_tokenizer):
    """fsspec's in-memory store stands in for gs:// (no GCS server here)."""
    build(settings(tmp_path / "local", corpus, byte_tokenizer), show_progress=False)
    cfg = settings("memory://bucket/ds", corpus, byte_tokenizer, staging=str(tmp_path / "s"))
    launch(cfg, LaunchConfig(), show_progress=False)
    store = Store("memory://bucket/ds")
    files = {rel: store.read_bytes(rel) for rel in store.sizes()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("timings")
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    assert files == build_tree(tmp_path / "local")
    store.remove(list(store.sizes()))


def test_an_upload_cut_short_once_the_staged_build_is_complete_is_finished_by_the_rerun(
        tmp_path, corpus, byte_tokenizer, monkeypatch):
    """Killed, or the connection lost, after the staged build's manifest was written but before
    everything was up: the re-run sends the rest (the manifest last) and says it built, not
    that the build was complete already."""
    build(settings(tmp_path / "local", corpus, byte_tokenizer), show_progress=False)
    cfg = settings("memory://cut-short/ds", corpus, byte_tokenizer, staging=str(tmp_path / "s"))
    store = Store("memory://cut-short/ds")
    with monkeypatch.context() as mp:
        def lost(self, manifest):
            raise StorageError("the connection was lost")
        mp.setattr(RemoteOut, "finish", lost)
        with pytest.raises(StorageError, match="the connection was lost"):
            launch(cfg, LaunchConfig(), show_progress=False)
    assert "manifest.json" not in store.sizes()
    outcome = launch(cfg, LaunchConfig(), show_progress=False)
    assert not outcome.already_complete
    files = {rel: store.read_bytes(rel) for rel in store.sizes()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("timings")
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    assert files == build_tree(tmp_path / "local")
    assert not any((tmp_path / "s").iterdir())  # the staging went with the finished upload
    assert launch(cfg, LaunchConfig(), show_progress=False).already_complete
    store.remove(list(store.sizes()))


@pytest.mark.slow
def test_a_failing_upload_stops_the_build_with_one_line(tmp_path, s3, corpus, byte_tokenizer,
                                                       monkeypatch):
    """The bucket removed mid-build: the build stops naming it; once it is back, the same
    command builds it whole."""
    cfg = settings(s3.url("gone"), corpus, byte_tokenizer, staging=str(tmp_path / "s"))
    put_file, calls = Store.put_file, [0]

    def delete_bucket_at_third(self, local, rel):
        calls[0] += 1
        if calls[0] == 3:
            for key in s3.keys():
                s3.client.delete_object(Bucket=s3.name, Key=key)
            s3.client.delete_bucket(Bucket=s3.name)
        put_file(self, local, rel)

    monkeypatch.setattr(Store, "put_file", delete_bucket_at_third)
    with pytest.raises(StorageError, match=f"the bucket {s3.name} does not exist"):
        run_remote(cfg)
    monkeypatch.setattr(Store, "put_file", put_file)
    s3.client.create_bucket(Bucket=s3.name)
    manifest, _ = run_remote(cfg)
    build(settings(tmp_path / "local", corpus, byte_tokenizer), show_progress=False)
    assert bucket_tree(s3, "gone") == build_tree(tmp_path / "local")


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1]])
@pytest.mark.slow
def test_a_build_split_into_tasks_lands_in_s3_as_the_single_build(tmp_path, s3, corpus,
                                                                  byte_tokenizer, order):
    """Tasks stage in --staging (every task sees it); each places its shards straight into the
    bucket; the last one merges and uploads the rest, the manifest last."""
    from longpack.pipeline.distribute import tasks

    build(settings(tmp_path / "local", corpus, byte_tokenizer), show_progress=False)
    cfg = settings(s3.url("tasked"), corpus, byte_tokenizer, tasks=3,
                   staging=str(tmp_path / "stg"))
    manifests = []
    for i in order:
        manifests.append(tasks.run_task(cfg, i, show_progress=False))
        if i != order[-1]:
            assert "tasked/manifest.json" not in s3.keys()
    assert manifests[-1] is not None and manifests[:-1] == [None, None]
    assert bucket_tree(s3, "tasked") == build_tree(tmp_path / "local")
    staged_shards = list((tmp_path / "stg").rglob("shard.*"))
    assert not staged_shards  # every shard went up and left the staging disk
    again = launch(cfg, LaunchConfig(), show_progress=False)  # finds it complete in the bucket
    assert json.dumps(again.manifest, sort_keys=True) == json.dumps(manifests[-1], sort_keys=True)
    assert not any((tmp_path / "stg").iterdir())


@pytest.mark.slow
def test_ray_tasks_build_into_s3_as_the_single_build(tmp_path, s3, corpus, byte_tokenizer):
    """A local Ray cluster started by the command: its workers see the bucket's endpoint and
    credentials from the environment, like the driver."""
    pytest.importorskip("ray")
    build(settings(tmp_path / "local", corpus, byte_tokenizer, workers=1), show_progress=False)
    cfg = settings(s3.url("ray"), corpus, byte_tokenizer, tasks=2, staging=str(tmp_path / "s"),
                   workers=1)
    result = CliRunner().invoke(pack, ["build", *to_flags(cfg, skip=("task_index",)),
                                       "--engine", "ray"])
    assert result.exit_code == 0 and "in 2 tasks" in result.output, result.output
    assert bucket_tree(s3, "ray") == build_tree(tmp_path / "local")
