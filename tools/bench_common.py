"""Helpers the benchmarks in tools/ share: the CPU other processes take meanwhile, the
checkout measured, the `pack` executable, PASS/FAIL."""

import contextlib
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class CpuWatch:
    """CPU the whole machine spent while a measurement ran, minus what we (and our children) spent:
    the load other processes put on the shared cores, in cores, to judge a figure's noise."""

    def __init__(self):
        self.t0, self.busy0, self.ours0 = time.perf_counter(), machine_busy(), our_cpu()

    def read(self) -> tuple[float, float]:
        """(CPU seconds we and our children used, cores' worth of CPU others used)."""
        wall = time.perf_counter() - self.t0
        ours = our_cpu() - self.ours0
        others = (machine_busy() - self.busy0) - ours
        return ours, max(others, 0.0) / wall


def machine_busy() -> float:
    """Busy CPU seconds of all cores since boot (/proc/stat, idle and iowait excluded)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def our_cpu() -> float:
    """CPU seconds of this process and of its waited-for children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def describe_checkout() -> str:
    """The commit and whether the code has local changes: what was measured."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "pipeline", "training", "archs",
                                "tools"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"{head}{' + local changes' if dirty else ''}"


def pack_executable() -> str:
    """The `pack` script beside this interpreter (the project venv), else the one on PATH."""
    here = Path(sys.executable).parent / "pack"
    return str(here) if here.exists() else (shutil.which("pack") or "pack")


SHARED = ROOT.parent / "shared"


def work_dir(given: Path | None, prefix: str) -> tuple[Path, bool]:
    """The benchmark's work directory: `given`, or a new temporary one; and whether it was made
    here (the benchmark may then delete it)."""
    work = given or Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    return work, given is None


def clean_work(work: Path, made_here: bool, keep: bool, names) -> None:
    """At a benchmark's end: keep `work` (--keep), remove it (made here), or remove only what
    the benchmark wrote into a directory it was given (`names` in it)."""
    if keep:
        print(f"\nkept {work}")
    elif made_here:
        shutil.rmtree(work, ignore_errors=True)
    else:
        for name in names:
            shutil.rmtree(work / name, ignore_errors=True)


def linked_copies(folder: Path, n: int, out: Path) -> Path:
    """OUT, holding FOLDER's parquet files linked n times under new names (copyKK-FILE, in that
    order): a corpus n times as large of the same documents, as pack build reads each name
    once."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for k in range(n):
        for path in sorted(folder.glob("*.parquet")):
            (out / f"copy{k:02d}-{path.name}").symlink_to(path.resolve())
    return out


def build_shared_corpus(work: Path, seq: int, formats=("mds", "memmap")) -> dict[str, Path]:
    """The shared FineWeb-Edu sample, gpt2.tiktoken, rows of `seq`, no val split, per format
    (kept in `work` and reused when already built)."""
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    tokenizer = SHARED / "tokenizers/gpt2.tiktoken"
    data = SHARED / "data/fineweb-edu-sample"
    if not tokenizer.exists() or not data.is_dir():
        sys.exit(f"needs the shared corpus and tokenizer at {SHARED}")
    outs = {}
    for fmt in formats:
        out = work / f"{fmt}-{seq}"
        if not (out / "manifest.json").exists():
            build(BuildConfig(out=str(out), dataset="fineweb-edu", inputs=(str(data),),
                              tokenizer=str(tokenizer), seq=seq, val_fraction=0.0, format=fmt),
                  show_progress=False)
        outs[fmt] = out
    return outs


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


@contextlib.contextmanager
def s3_server(bucket: str = "bench"):
    """A real S3-compatible server (moto's) in a process of its own on 127.0.0.1, with `bucket`
    made; yields the environment (endpoint, dummy credentials) that points clients at it. In a
    process of its own (nice 19), its CPU is not the measured process's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # at the lowest CPU priority: it stands in for a store on other machines, so what it
    # takes of this machine's cores should disturb the measured process as little as it can
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=lambda: os.nice(19))
    env = {**os.environ, "S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
           "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto's S3 server did not start (pip install "
                                       "'moto[server]')") from None
                time.sleep(0.1)
        import boto3

        boto3.client("s3", endpoint_url=env["S3_ENDPOINT_URL"], aws_access_key_id="bench",
                     aws_secret_access_key="bench", region_name="us-east-1"
                     ).create_bucket(Bucket=bucket)
        yield env
    finally:
        server.terminate()
        server.wait()
