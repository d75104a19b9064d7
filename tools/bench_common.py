"""Helpers the benchmarks in tools/ share: the CPU other processes take meanwhile, the
checkout measured, the `pack` executable, PASS/FAIL."""

import os
import resource
import shutil
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


def build_shared_corpus(work: Path, seq: int, formats=("mds", "memmap")) -> dict[str, Path]:
    """The shared FineWeb-Edu sample, gpt2.tiktoken, rows of `seq`, no val split, per format
    (kept in `work` and reused when already built)."""
    from pipeline.build import build
    from pipeline.config import BuildConfig

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
