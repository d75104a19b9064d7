#!/usr/bin/env python
"""Benchmark `pack stats` throughput against a plain sequential read of the same shard files.

What it measures, in one run:

1. Corpus. `pack build --dataset fineweb-edu --input /work/shared/data/fineweb-edu-sample
   --tokenizer gpt2.tiktoken --seq 32768 --val-fraction 0.001 --shard-bytes 33554432 --format FMT
   --quiet` for FMT = mds (zstd) and memmap: ~7.3 M real GPT-2 tokens (~15 MB as memmap, one
   shard). With --shard-mib N other than 32, a second build with `--shard-bytes N MiB` reads
   the sample's files R times over (symlinks under other names) so that its train split fills
   at least one N MiB shard (64, pack build's default: R = 5, one 64 MiB shard and one of the
   rest); that build is then the base. The base train split's shard files are then copied K
   times (real copies, not links, so that a cold read reads K times from disk) into
   BIG-FMT/train/ with consecutive shard numbers; a copied index.json names the renamed files
   (MDS: raw_data and zip_data basenames; memmap: tokens and docs basenames and the top-level
   row count). K is chosen so that the memmap split holds --mb MiB on disk; MDS gets the same
   K, hence the same tokens. manifest.json is not copied (nor the val split), so stats runs
   without one and gets `--eos-id 50256`. A second pair of datasets with --mb / 4 (timed by
   `pack stats` only) shows whether memory grows with the data; it is scanned 4 times per
   round to the big one's once, so that both sizes are measured over as many shards.
   `pack stats BIG-FMT --eos-id 50256` must exit 0 once before anything is timed.
2. Per format, per round, alternating (the order of formats and of the steps rotates each round):
   - read: `cat FILES > /dev/null` (a subprocess) and, in this process, `np.fromfile(f, uint8)`
     of each file plus a touch of one byte per page; the faster of the two is the read baseline.
   - MDS only, decompress: read each shard file and `ZstdDecompressor().decompress(bytes)`,
     sequentially in one thread: the least any reader of zstd shards has to do.
   - pack stats: `pack stats BIG-FMT --eos-id 50256 --json > /dev/null` as a subprocess, wall
     clock with start-up included; its peak RSS (VmHWM, read every 10 ms until it exits). Also
     `longpack.pipeline.stats.report.collect(BIG-FMT, eos_id=50256)` in this process (start-up excluded).
   Rates are bytes on disk of the split (all its files, index.json included) per second.
3. Page cache. Warm: every file was read once before the round (not timed). Cold (--cold, on by
   default when this process can write /proc/sys/vm/drop_caches, i.e. runs as root): `sync;
   echo 3 > drop_caches` before each timed step, then (pack stats only) a stats run over the tiny
   val split of the base build, so that Python, numpy and zstandard are back in memory and only
   the data is read from disk. Each row also shows the CPU seconds the step used and the cores'
   worth of CPU other processes used meanwhile ("others", from /proc/stat).

Targets (best run of each measurement; judged on the `pack stats` subprocess wall time, the
in-process figure is printed beside it): memmap: stats bytes/s >= 0.7 x read baseline with a cold
cache (the issue's premise is a scan bound by reading the disk; with a warm cache the "read" is a
page-cache copy at 10-16 GB/s, printed but not judged); MDS: decompress seconds / stats seconds >=
1.0 (stats no slower than decompressing the shards), warm and, when measured, cold; memory: peak
RSS at --mb <= 1.1 x peak RSS at --mb / 4. It prints a table with PASS/FAIL per target and exits 0
whatever the figures are: it is a measuring tool, not a test. --profile adds a cProfile of
collect() (main thread only; the read-ahead threads are not profiled) on each big dataset, top 8
functions by own time.

    .venv/bin/python tools/bench_stats.py [--work DIR] [--mb 1024] [--shard-mib 32] [--repeat 3]
                                          [--no-cold] [--profile] [--keep]
"""

import argparse
import cProfile
import io
import json
import math
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import zstandard

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench_common import (  # noqa: E402
    SHARED,
    CpuWatch,
    clean_work,
    describe_checkout,
    linked_copies,
    pack_executable,
    verdict,
    work_dir,
)

from longpack.pipeline.formats import open_format  # noqa: E402  (the checkout's code)
from longpack.pipeline.stats.report import collect  # noqa: E402

FINEWEB_SAMPLE = SHARED / "data" / "fineweb-edu-sample"
GPT2_TIKTOKEN = SHARED / "tokenizers" / "gpt2.tiktoken"
SEQ = 32768
EOS_ID = 50256
SHARD_MIB = 32  # --shard-bytes of the base build: more than the sample fills (one 14.6 MB shard)
VAL_FRACTION = 0.001
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
MIB = 1 << 20
HWM_INTERVAL = 0.01  # seconds between readings of the stats process's VmHWM
FORMATS = ("memmap", "mds")

TARGET_MEMMAP = 0.7  # stats disk bytes/s over the read baseline
TARGET_MDS = 1.0  # decompress-only seconds over stats seconds
TARGET_RSS_GROWTH = 1.1  # peak RSS at --mb over peak RSS at --mb / 4


# ------------------------------------------------------------------------------------ machine

def can_drop_caches() -> bool:
    try:
        drop_caches()
        return True
    except OSError:
        return False


def drop_caches():
    os.sync()
    DROP_CACHES.write_text("3\n")


# ----------------------------------------------------------------------------------- datasets

def build_base(work: Path, fmt: str, shard_mib: int = SHARD_MIB, repeats: int = 1) -> Path:
    """pack build of the sample (read `repeats` times over, through links) into work/base-FMT
    (work/base-FMT-NMiB for another --shard-mib)."""
    out = work / (f"base-{fmt}" if shard_mib == SHARD_MIB else f"base-{fmt}-{shard_mib}MiB")
    if (out / "manifest.json").exists():
        print(f"{out.name}: reusing the existing build", flush=True)
        return out
    source = FINEWEB_SAMPLE
    if repeats > 1:  # the same files under other names: pack build reads each name once
        source = linked_copies(FINEWEB_SAMPLE, repeats, work / f"input-x{repeats}")
    cmd = [pack_executable(), "build", "--dataset", "fineweb-edu", "--input", str(source),
           "--tokenizer", str(GPT2_TIKTOKEN), "--seq", str(SEQ), "--val-fraction",
           str(VAL_FRACTION), "--shard-bytes", str(shard_mib * MIB), "--out", str(out),
           "--format", fmt, "--quiet"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    m = json.loads((out / "manifest.json").read_text())["splits"]["train"]
    print(f"{out.name}: pack build {time.perf_counter() - t0:.1f} s; train {m['tokens']:,} "
          f"tokens, {m['rows']:,} rows, {m['shards']} shard(s), {m['bytes'] / 1e6:.1f} MB",
          flush=True)
    return out


def repeats_to_fill(work: Path, shard_mib: int) -> int:
    """How many times the sample must be read for its train split to fill one shard of
    `shard_mib` MiB (the sample itself fills 14.6 MB; pack build's default shard is 64 MiB)."""
    rows = json.loads((work / "base-memmap" / "manifest.json").read_text())["splits"]["train"]["rows"]
    rows_per_shard = shard_mib * MIB // (SEQ * 2)  # uint16 tokens: GPT-2's ids fit
    return max(1, math.ceil(rows_per_shard / rows))


def renamed(name: str, number: int) -> str:
    """shard.00000.REST -> shard.NNNNN.REST"""
    prefix, _, rest = name.split(".", 2)
    return f"{prefix}.{number:05d}.{rest}"


def replicate(base_split: Path, out: Path, fmt: str, copies: int) -> dict:
    """Copy the base split's shards `copies` times into out/train with consecutive numbers."""
    split = out / "train"
    marker = out / "bench_stats.json"
    want = {"base": str(base_split), "copies": copies, "format": fmt}
    if marker.exists() and json.loads(marker.read_text()) == want:
        return describe(split, fmt, copies, reused=True)
    shutil.rmtree(out, ignore_errors=True)
    split.mkdir(parents=True)
    index = json.loads((base_split / "index.json").read_text())
    shards, number = [], 0
    for _ in range(copies):
        for entry in index["shards"]:
            entry = json.loads(json.dumps(entry))
            for info in entry.values():  # each file the entry names, whatever its format
                if not isinstance(info, dict) or "basename" not in info:
                    continue
                src = base_split / info["basename"]
                info["basename"] = renamed(info["basename"], number)
                if src.exists():  # MDS raw_data names the uncompressed file, absent on disk
                    shutil.copyfile(src, split / info["basename"])
            shards.append(entry)
            number += 1
    index["shards"] = shards
    if "rows" in index:  # memmap's index counts its rows
        index["rows"] = sum(s["rows"] for s in shards)
    (split / "index.json").write_text(json.dumps(index))
    marker.write_text(json.dumps(want))
    return describe(split, fmt, copies, reused=False)


def describe(split: Path, fmt: str, copies: int, reused: bool) -> dict:
    shards = open_format(split)
    shard_files = [split / f.basename for i in range(len(shards)) for f in shards.stored(i)]
    files = sorted(p for p in split.iterdir() if p.is_file())
    rows = sum(shards.rows_in(i) for i in range(len(shards)))
    return {"dir": split.parent, "split": split, "fmt": fmt, "copies": copies, "reused": reused,
            "files": files, "shard_files": shard_files,
            "disk_bytes": sum(p.stat().st_size for p in files),
            "shard_bytes": sum(p.stat().st_size for p in shard_files),
            "rows": rows, "tokens": rows * SEQ, "shards": len(shards)}


# ------------------------------------------------------------------------------- measurements

def timed(fn, nbytes: int) -> dict:
    watch = CpuWatch()
    t0 = time.perf_counter()
    extra = fn() or {}
    seconds = time.perf_counter() - t0
    cpu, others = watch.read()
    return {"seconds": seconds, "rate": nbytes / seconds, "cpu": cpu, "others": others, **extra}


def read_cat(ds: dict) -> dict:
    def run():
        subprocess.run(["cat", *map(str, ds["files"])], stdout=subprocess.DEVNULL, check=True)
    return timed(run, ds["disk_bytes"])


def read_numpy(ds: dict) -> dict:
    def run():
        touch = 0
        for p in ds["files"]:
            a = np.fromfile(p, np.uint8)
            touch += int(a[::4096].sum())
            del a
        return {"touch": touch}
    return timed(run, ds["disk_bytes"])


def decompress(ds: dict) -> dict:
    def run():
        d = zstandard.ZstdDecompressor()
        raw = 0
        for p in ds["shard_files"]:
            raw += len(d.decompress(p.read_bytes()))
        return {"raw_bytes": raw}
    return timed(run, ds["disk_bytes"])


def stats_cmd(path: Path) -> list[str]:
    return [pack_executable(), "stats", str(path), "--eos-id", str(EOS_ID), "--json"]


class HwmSampler(threading.Thread):
    """Reads VmHWM (the peak RSS of a process's address space) of `pid` every HWM_INTERVAL until
    it exits; VmHWM only grows, so the last reading is the peak up to the last few ms. (The
    child's ru_maxrss from wait4 is no use here: Linux carries the parent's peak RSS into it at
    exec, and this process holds a gigabyte-scale read now and then.)"""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.path, self.peak, self.samples = f"/proc/{pid}/status", 0, 0
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            try:
                with open(self.path) as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.peak = max(self.peak, int(line.split()[1]) * 1024)
                            self.samples += 1
                            break
            except (FileNotFoundError, ProcessLookupError):
                return
            self._stop_event.wait(HWM_INTERVAL)

    def stop(self):
        self._stop_event.set()
        self.join()


def stats_subprocess(ds: dict) -> dict:
    """Wall clock of `pack stats --json > /dev/null`; peak RSS of that process (VmHWM)."""
    def run():
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(stats_cmd(ds["dir"]), stdout=subprocess.DEVNULL, stderr=err)
            sampler = HwmSampler(proc.pid)
            sampler.start()
            proc.wait()
            sampler.stop()
            if proc.returncode != 0:
                err.seek(0)
                sys.exit(f"{' '.join(stats_cmd(ds['dir']))}: exit {proc.returncode}\n"
                         f"{err.read().decode(errors='replace')[-2000:]}")
        return {"peak_rss": sampler.peak}
    return timed(run, ds["disk_bytes"])


def stats_inprocess(ds: dict) -> dict:
    def run():
        report = collect(ds["dir"], eos_id=EOS_ID)
        if not report["checks"]["ok"]:
            sys.exit(f"collect({ds['dir']}): problems {report['checks']['problems'][:3]}")
        return {"tokens": report["total"]["tokens"]}
    return timed(run, ds["disk_bytes"])


STEPS = {"cat": read_cat, "numpy": read_numpy, "decompress": decompress,
         "stats": stats_subprocess, "collect": stats_inprocess}
LABELS = {"cat": "read: cat FILES > /dev/null",
          "numpy": "read: np.fromfile per file",
          "decompress": "zstd decompress only, 1 thread",
          "stats": "pack stats (subprocess wall)",
          "collect": "collect() in process",
          "stats-small": "pack stats, --mb / 4 dataset"}


def warm_code(tiny: Path):
    """After a cache drop: load Python, numpy, zstandard and pipeline/ again (not the data)."""
    subprocess.run(stats_cmd(tiny), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(big: dict, small: dict, tiny: dict, repeat: int, cold: bool) -> dict:
    """{(fmt, state, step): [run, ...]}, the measurements interleaved round by round."""
    runs: dict = {}
    states = ["warm", "cold"] if cold else ["warm"]
    for r in range(repeat):
        fmts = FORMATS if r % 2 == 0 else FORMATS[::-1]
        for state in states:
            for fmt in fmts:
                steps = ["cat", "numpy"] + (["decompress"] if fmt == "mds" else []) + \
                        ["stats", "collect"]
                k = r % len(steps)
                steps = steps[k:] + steps[:k]
                if small[fmt]:  # as many shards scanned as in the big dataset's one run
                    steps += ["stats-small"] * round(big[fmt]["shards"] / small[fmt]["shards"])
                if state == "warm":
                    for ds in (big[fmt], small[fmt]):  # everything in the page cache
                        if ds:
                            read_cat(ds)
                for step in steps:
                    ds = small[fmt] if step == "stats-small" else big[fmt]
                    if state == "cold":
                        drop_caches()
                        if step in ("stats", "collect", "stats-small"):
                            warm_code(tiny[fmt])
                    fn = STEPS["stats" if step == "stats-small" else step]
                    res = fn(ds)
                    runs.setdefault((fmt, state, step), []).append(res)
                    rss = f", peak RSS {res['peak_rss'] / MIB:.0f} MiB" if "peak_rss" in res else ""
                    print(f"  run {r + 1}/{repeat} {state} {fmt:6} {step:11} "
                          f"{res['seconds']:7.3f} s {res['rate'] / 1e6:9.1f} MB/s "
                          f"(cpu {res['cpu']:.2f} s, others {res['others']:.2f} cores{rss})",
                          flush=True)
    return runs


# ------------------------------------------------------------------------------------ report

def best(runs: list[dict]) -> dict:
    return min(runs, key=lambda x: x["seconds"])


def table(fmt: str, state: str, ds: dict, runs: dict) -> tuple[dict, list[tuple]]:
    """Print one format x cache-state table; return the best figures and the target rows."""
    get = {s: runs.get((fmt, state, s)) for s in LABELS}
    b = {s: best(v) for s, v in get.items() if v}
    read_step = max(("cat", "numpy"), key=lambda s: b[s]["rate"])
    baseline = b[read_step]["rate"]
    n = len(get["stats"])
    print(f"\n== {fmt}, {state} page cache: {ds['disk_bytes'] / MIB:,.1f} MiB on disk, "
          f"{ds['tokens']:,} tokens, {ds['shards']} shards ({ds['copies']} copies of the base "
          f"train split) (best of {n} runs each)")
    print(f"  read baseline = {LABELS[read_step].split(': ')[1]} (the faster read)")
    dec = b.get("decompress")
    head = f"  {'':34}{'seconds':>8}{'MB/s':>9}{'x read':>8}"
    head += f"{'dec/this':>9}" if dec else ""
    print(head + f"{'cpu s':>7}{'others':>7}  MB/s of every run")
    for step in LABELS:
        if step not in b:
            continue
        x = b[step]
        line = f"  {LABELS[step]:34}{x['seconds']:8.3f}{x['rate'] / 1e6:9.1f}"
        line += f"{x['rate'] / baseline:8.3f}" if step != "stats-small" else f"{'-':>8}"
        if dec:
            line += (f"{dec['seconds'] / x['seconds']:9.3f}" if step != "stats-small"
                     else f"{'-':>9}")
        line += f"{x['cpu']:7.2f}{x['others']:7.2f}  "
        line += " ".join(f"{r['rate'] / 1e6:.0f}" for r in get[step])
        if step == "stats-small":
            line += f"  ({x['rate'] * x['seconds'] / MIB:,.0f} MiB)"
        print(line)
    if dec:
        print(f"  decompressed: {dec['raw_bytes'] / MIB:,.1f} MiB raw from "
              f"{ds['shard_bytes'] / MIB:,.1f} MiB of .zstd")
    targets = []
    s, c = b["stats"], b["collect"]
    if fmt == "memmap" and state == "warm":  # no disk read: the baseline is a page-cache copy
        targets.append((f"memmap, warm: pack stats MB/s / read (not judged: no disk read) "
                        f"{s['rate'] / baseline:.3f}, collect() {c['rate'] / baseline:.3f}", "",
                        ""))
    elif fmt == "memmap":
        targets.append((f"memmap, {state}: pack stats MB/s >= {TARGET_MEMMAP} x read",
                        f"{s['rate'] / baseline:.3f}", verdict(s["rate"] / baseline
                                                               >= TARGET_MEMMAP)))
        targets.append((f"  (in process, not judged: collect() {c['rate'] / baseline:.3f})", "",
                        ""))
    else:
        targets.append((f"mds, {state}: decompress s / pack stats s >= {TARGET_MDS}",
                        f"{dec['seconds'] / s['seconds']:.3f}",
                        verdict(dec["seconds"] / s["seconds"] >= TARGET_MDS)))
        targets.append((f"  (in process, not judged: decompress s / collect() s "
                        f"{dec['seconds'] / c['seconds']:.3f})", "", ""))
    return b, targets


def rss_report(fmt: str, runs: dict, big: dict, small: dict) -> list[tuple]:
    rb = [r["peak_rss"] for st in ("warm", "cold") for r in runs.get((fmt, st, "stats"), [])]
    rs = [r["peak_rss"] for st in ("warm", "cold")
          for r in runs.get((fmt, st, "stats-small"), [])]
    print(f"  {fmt}: peak RSS of pack stats: {max(rb) / MIB:.0f} MiB on "
          f"{big['disk_bytes'] / MIB:,.0f} MiB (every run: "
          + " ".join(f"{x / MIB:.0f}" for x in rb) + ")"
          + (f", {max(rs) / MIB:.0f} MiB on {small['disk_bytes'] / MIB:,.0f} MiB (every run: "
             + " ".join(f"{x / MIB:.0f}" for x in rs) + ")" if rs else ""))
    if not rs:
        return []
    growth = max(rb) / max(rs)
    return [(f"{fmt}: peak RSS at --mb <= {TARGET_RSS_GROWTH} x at --mb / 4",
             f"{growth:.3f} ({max(rb) / MIB:.0f} MiB)", verdict(growth <= TARGET_RSS_GROWTH))]


def print_targets(rows: list[tuple]):
    print("\n== targets")
    width = max(len(r[0]) for r in rows)
    for name, value, v in rows:
        print(f"  {name:<{width}}  {value:>16}  {v}".rstrip())


def profile(ds: dict, top: int = 8):
    """cProfile of collect() on a warm dataset: main thread only (read-ahead threads unseen)."""
    read_cat(ds)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    collect(ds["dir"], eos_id=EOS_ID)
    prof.disable()
    wall = time.perf_counter() - t0
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if "ncalls" in line)
    print(f"\n== cProfile of collect() on {ds['dir'].name}, warm, {wall:.2f} s under the profiler "
          f"(main thread only), top {top} by tottime")
    for line in lines[start:start + top + 1]:
        print("  " + line.replace(str(ROOT) + "/", "").replace(sys.prefix, "VENV"))


# -------------------------------------------------------------------------------------- main

def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work", type=Path, help="working directory (default: a new temp dir)")
    p.add_argument("--mb", type=float, default=1024,
                   help="size of the big memmap train split on disk, MiB (MDS: same tokens)")
    p.add_argument("--repeat", type=int, default=3,
                   help="rounds of all measurements; the best run of each is reported")
    p.add_argument("--cold", action=argparse.BooleanOptionalAction, default=None,
                   help="also measure with the page cache dropped before each step "
                        "(default: if /proc/sys/vm/drop_caches is writable)")
    p.add_argument("--small", action=argparse.BooleanOptionalAction, default=True,
                   help="also run pack stats on a --mb / 4 dataset, for peak RSS vs size")
    p.add_argument("--shard-mib", type=int, default=SHARD_MIB,
                   help="--shard-bytes of the base build, MiB; above the sample's 14.6 MB the "
                        "sample is read several times over so that its train split fills a shard")
    p.add_argument("--profile", action="store_true",
                   help="cProfile collect() on each big dataset (top 8 by own time)")
    p.add_argument("--keep", action="store_true", help="keep the datasets")
    return p.parse_args()


def main():
    args = parse_args()
    cold = can_drop_caches() if args.cold is None else args.cold
    if cold and not can_drop_caches():
        sys.exit(f"--cold needs to write {DROP_CACHES} (root)")
    work, made_work = work_dir(args.work, "bench_stats.")
    print(f"bench_stats: work {work}, --mb {args.mb:g}, --shard-mib {args.shard_mib}, "
          f"--repeat {args.repeat}, cold {cold}, "
          f"cpus {os.cpu_count()}, python {sys.version.split()[0]}, numpy {np.__version__}, "
          f"zstandard {zstandard.__version__}, checkout {describe_checkout()}", flush=True)
    print("MB/s = bytes on disk of the split / seconds (10^6 B/s); cpu s = CPU seconds the step "
          "used; others = cores' worth of CPU other processes used meanwhile", flush=True)
    try:
        big, small, tiny, bases = {}, {}, {}, {}
        for fmt in FORMATS:
            bases[fmt] = build_base(work, fmt)
            tiny[fmt] = bases[fmt] / "val"
        if args.shard_mib != SHARD_MIB:
            repeats = repeats_to_fill(work, args.shard_mib)
            for fmt in FORMATS:
                bases[fmt] = build_base(work, fmt, args.shard_mib, repeats)
        base_bytes = describe(bases["memmap"] / "train", "memmap", 1, True)["disk_bytes"]
        copies = max(1, math.ceil(args.mb * MIB / base_bytes))
        for fmt in FORMATS:
            t0 = time.perf_counter()
            big[fmt] = replicate(bases[fmt] / "train", work / f"big-{fmt}", fmt, copies)
            small[fmt] = (replicate(bases[fmt] / "train", work / f"small-{fmt}", fmt,
                                    max(1, copies // 4)) if args.small else None)
            for ds in filter(None, (big[fmt], small[fmt])):
                print(f"{ds['dir'].name}: {ds['copies']} copies, {ds['shards']} shards, "
                      f"{len(ds['files'])} files, {ds['disk_bytes'] / MIB:,.1f} MiB on disk, "
                      f"{ds['tokens']:,} tokens" + (" (reused)" if ds["reused"] else ""),
                      flush=True)
            print(f"  ({time.perf_counter() - t0:.1f} s to copy)", flush=True)
            check = subprocess.run(stats_cmd(big[fmt]["dir"]), capture_output=True, text=True)
            if check.returncode != 0:
                sys.exit(f"{' '.join(stats_cmd(big[fmt]['dir']))}: exit {check.returncode}\n"
                         f"{check.stdout[-2000:]}{check.stderr[-2000:]}")
            total = json.loads(check.stdout)["total"]
            print(f"  pack stats {big[fmt]['dir'].name} --eos-id {EOS_ID}: exit 0, "
                  f"{total['tokens']:,} tokens, {total['documents']:,} documents", flush=True)
        os.sync()
        runs = measure(big, small, tiny, args.repeat, cold)
        targets = []
        for state in (["warm", "cold"] if cold else ["warm"]):
            for fmt in FORMATS:
                targets += table(fmt, state, big[fmt], runs)[1]
        print()
        for fmt in FORMATS:
            targets += rss_report(fmt, runs, big[fmt], small[fmt])
        print_targets(targets)
        if args.profile:
            for fmt in FORMATS:
                profile(big[fmt])
    finally:
        clean_work(work, made_work, args.keep,
                   [f"{size}-{fmt}" for fmt in FORMATS for size in ("big", "small")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
