"""pack build --engine ray: the tasks as Ray tasks on a real local cluster, byte-identical."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import build_tree, make_texts, write_jsonl
from longpack.core.errors import LongpackError, SettingsError
from longpack.core.settings import to_flags
from longpack.pipeline.build import build
from longpack.pipeline.cli import pack
from longpack.pipeline.config import WORK_DIR, BuildConfig

pytest.importorskip("ray")
RAY = str(Path(sys.executable).parent / "ray")


def corpus(tmp_path: Path, files: int = 4, docs: int = 300, repeat: int = 1) -> Path:
    folder = tmp_path / "jsonl"
    folder.mkdir()
    texts = make_texts(files * docs, seed=11)
    for f in range(files):
        records = [{"text": t * repeat} for t in texts[f * docs:(f + 1) * docs]]
        write_jsonl(folder / f"part-{f}.jsonl", records + ([b"{bad"] if f == 1 else []))
    return folder


def settings(tmp_path: Path, inputs: Path, tokenizer: str, out: str, rows_per_shard: int = 6,
             **kw) -> BuildConfig:
    return BuildConfig(out=str(tmp_path / out), dataset="jsonl", inputs=(str(inputs),),
                       tokenizer=tokenizer, seq=128, val_fraction=0.1,
                       shard_bytes=128 * 2 * rows_per_shard, workers=1, **kw)


@pytest.fixture(scope="module")
def ray_cluster():
    """A real one-node Ray cluster on 127.0.0.1, started and stopped here. Without token
    authentication (it listens on the loopback only): a cluster that `ray start` started and a
    driver in this process did not agree on the token of ~/.ray/auth_token (Ray 2.60)."""
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="lpray")  # short: Ray's socket paths have a length limit
    started = subprocess.run([RAY, "start", "--head", "--node-ip-address=127.0.0.1",
                              f"--port={port}", "--num-cpus=2", f"--temp-dir={temp}",
                              "--disable-usage-stats", "--include-dashboard=false"],
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    yield f"127.0.0.1:{port}"
    subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)
    if saved is None:
        os.environ.pop("RAY_AUTH_MODE")
    else:
        os.environ["RAY_AUTH_MODE"] = saved


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_a_ray_build_on_an_existing_cluster_is_byte_identical(tmp_path, byte_tokenizer,
                                                              ray_cluster, capsys, packing):
    from longpack.pipeline.distribute.engine_ray import build_with_ray

    inputs = corpus(tmp_path, docs=1000, repeat=4)
    build(settings(tmp_path, inputs, byte_tokenizer, "single", rows_per_shard=64,
                   packing=packing), show_progress=False)
    m = build_with_ray(settings(tmp_path, inputs, byte_tokenizer, "ray", rows_per_shard=64,
                                tasks=3, packing=packing), ray_cluster, True)
    assert m["timings"]["tasks"] == 3
    assert build_tree(tmp_path / "ray") == build_tree(tmp_path / "single")
    # one bar, fed by the three tasks' reports: it counts documents of more than one task
    bars = [line for line in capsys.readouterr().err.split("\r") if " docs (" in line]
    assert bars, "no progress shown"
    shown = max(float(b.split(" docs")[0].rstrip("k")) * (1000 if "k docs" in b else 1)
                for b in bars)
    assert shown > 1500, bars[-3:]


@pytest.mark.slow
def test_the_command_line_starts_a_local_cluster_and_stops_it(tmp_path, byte_tokenizer):
    inputs = corpus(tmp_path)
    build(settings(tmp_path, inputs, byte_tokenizer, "single"), show_progress=False)
    flags = to_flags(settings(tmp_path, inputs, byte_tokenizer, "ray", tasks=2),
                     skip=("task_index",))
    r = CliRunner().invoke(pack, ["build", *flags, "--engine", "ray"])
    assert r.exit_code == 0 and "in 2 tasks" in r.output, r.output
    assert build_tree(tmp_path / "ray") == build_tree(tmp_path / "single")


@pytest.mark.slow
def test_a_worker_killed_mid_task_is_retried_and_the_bytes_are_the_same(tmp_path, byte_tokenizer,
                                                                        ray_cluster):
    from longpack.pipeline.distribute.engine_ray import build_with_ray

    # Long tasks (a window to kill one in), in large shards: ~40,000 shards of 6 rows would
    # take ~1 ms each to write, 45 s of a single build, and as long to place.
    inputs = corpus(tmp_path, files=2, docs=2000, repeat=12)
    build(settings(tmp_path, inputs, byte_tokenizer, "single", rows_per_shard=64),
          show_progress=False)
    cfg = settings(tmp_path, inputs, byte_tokenizer, "ray", rows_per_shard=64, tasks=2)
    result = {}
    thread = threading.Thread(target=lambda: result.update(m=build_with_ray(cfg, ray_cluster,
                                                                            False)))
    thread.start()
    tokens = tmp_path / "ray" / WORK_DIR / "task.00001" / "train.tokens"
    deadline = time.monotonic() + 120
    killed = None
    while killed is None:
        assert time.monotonic() < deadline and thread.is_alive(), "task 1 never ran"
        if tokens.exists() and tokens.stat().st_size:
            killed = _worker_running("_tokenize")
        time.sleep(0.02)
    os.kill(killed, signal.SIGKILL)
    thread.join(timeout=300)
    assert "m" in result, "the build did not finish after its worker was killed"
    assert build_tree(tmp_path / "ray") == build_tree(tmp_path / "single")


def _worker_running(function: str) -> int | None:
    """A Ray worker process busy with `function` (Ray titles it `ray::function`)."""
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"ray::{function}".encode() in cmdline:
            return int(proc.name)
    return None


@pytest.mark.slow
def test_a_task_error_is_one_line_naming_the_task_and_not_retried(tmp_path, byte_tokenizer,
                                                                  ray_cluster):
    from longpack.pipeline.distribute.engine_ray import build_with_ray

    inputs = corpus(tmp_path)
    cfg = settings(tmp_path, inputs, byte_tokenizer, "ray", tasks=2, on_error="fail")
    t0 = time.monotonic()
    with pytest.raises(LongpackError, match=r"^task 0: .*part-1\.jsonl, line 301: bad_json"):
        build_with_ray(cfg, ray_cluster, False)
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "ray" / "manifest.json").exists()


def test_an_address_where_no_cluster_answers_is_one_line(tmp_path, byte_tokenizer):
    from longpack.pipeline.distribute.engine_ray import build_with_ray

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = settings(tmp_path, corpus(tmp_path), byte_tokenizer, "ray", tasks=2)
    with pytest.raises(SettingsError, match=rf"--ray-address 127.0.0.1:{port}: cannot connect"):
        build_with_ray(cfg, f"127.0.0.1:{port}", False)
