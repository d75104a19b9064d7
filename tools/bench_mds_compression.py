#!/usr/bin/env python
"""What each zstd level costs and saves on MDS shards (issue 33): the figures `--compression`'s
default is chosen from.

Builds a real corpus (the FineWeb-Edu sample of ../shared, GPT-2, `--seq 32768`, copied
`--copies` times) once as uncompressed MDS, then compresses every shard at each level as
pipeline/formats/mds_write.py does (`ZstdCompressor(level, threads=-1)`) and decompresses it as
the trainer and `pack stats` do. Per level: the shards' size against uncompressed, the CPU
seconds to compress (and that as a share of the whole build's CPU), the CPU to decompress.
With `--builds`, `pack build --compression zstd:L` end to end at each level too (process CPU
and wall, best of `--repeat`).

    python tools/bench_mds_compression.py [--copies 4] [--levels 1,2,3,6,9,19] [--builds]
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import CpuWatch, describe_checkout, pack_executable  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
FINEWEB = SHARED / "data" / "fineweb-edu-sample"
GPT2 = SHARED / "tokenizers" / "gpt2.tiktoken"


def cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def children_cpu() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def build(inputs: Path, out: Path, compression: str, workers: int) -> dict:
    """`pack build` of `inputs` into `out`: {"cpu", "wall"} of the process."""
    shutil.rmtree(out, ignore_errors=True)
    before, t0 = children_cpu(), time.perf_counter()
    subprocess.run([pack_executable(), "build", "--dataset", "fineweb-edu", "--input", str(inputs),
                    "--tokenizer", str(GPT2), "--seq", "32768", "--workers", str(workers),
                    "--compression", compression, "--out", str(out), "--quiet"],
                   check=True, capture_output=True)
    return {"cpu": children_cpu() - before, "wall": time.perf_counter() - t0}


def raw_shards(out: Path) -> list[bytes]:
    return [p.read_bytes() for split in ("train", "val") if (out / split).is_dir()
            for p in sorted((out / split).glob("shard.*.mds"))]


def measure_level(shards: list[bytes], level: int, repeat: int) -> dict:
    best = None
    for _ in range(repeat):
        compressor = zstandard.ZstdCompressor(level=level, threads=-1)
        c0, t0 = cpu(), time.perf_counter()
        packed = [compressor.compress(s) for s in shards]
        run = {"compress_cpu": cpu() - c0, "compress_wall": time.perf_counter() - t0}
        d0 = cpu()
        for p, s in zip(packed, shards):
            assert zstandard.ZstdDecompressor().decompress(p, max_output_size=len(s)) == s
        run["decompress_cpu"] = cpu() - d0
        run["bytes"] = sum(len(p) for p in packed)
        if best is None or run["compress_cpu"] < best["compress_cpu"]:
            best = run
    return best


def positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number from 1")
    return n


def zstd_levels(text: str) -> list[int]:
    """--levels: comma-separated zstd levels, each 1 to 22 (what --compression zstd:LEVEL takes)."""
    try:
        levels = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give levels as 1,3,9") from None
    if not levels or any(not 1 <= x <= 22 for x in levels):
        raise argparse.ArgumentTypeError(f"{text!r}: each level is 1 to 22")
    return levels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=positive, default=4, help="copies of the FineWeb-Edu sample")
    ap.add_argument("--levels", type=zstd_levels, default="1,2,3,4,6,9,19")
    ap.add_argument("--repeat", type=positive, default=3, help="best of N by CPU")
    ap.add_argument("--workers", type=positive, default=2)
    ap.add_argument("--builds", action="store_true",
                    help="also time pack build end to end at each level")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    if not GPT2.is_file() or not FINEWEB.is_dir():
        print(f"needs ../shared (the FineWeb-Edu sample and gpt2.tiktoken) at {SHARED}")
        return 2
    levels = args.levels
    watch = CpuWatch()
    work = Path(tempfile.mkdtemp(prefix="bench_mdsz."))
    try:
        inputs = work / "in"
        inputs.mkdir()
        for c in range(args.copies):
            for path in sorted(FINEWEB.glob("*.parquet")):
                shutil.copyfile(path, inputs / f"copy{c}_{path.name}")
        plain = min((build(inputs, work / "none", "none", args.workers)
                     for _ in range(args.repeat)), key=lambda r: r["cpu"])
        shards = raw_shards(work / "none")
        raw = sum(len(s) for s in shards)
        tokens = json.loads((work / "none" / "manifest.json").read_text())["counts"]
        print(f"checkout {describe_checkout()}; FineWeb-Edu sample x {args.copies}, gpt2, seq "
              f"32768, {len(shards)} shards, {raw / 1e6:.1f} MB uncompressed; pack build "
              f"--compression none: {plain['cpu']:.2f} CPU s, {plain['wall']:.2f} s wall "
              f"(--workers {args.workers}, best of {args.repeat})")
        print(f"{'level':>5} {'size':>7} {'MB':>7} {'comp CPU s':>10} {'of build':>8} "
              f"{'MB/CPU s':>8} {'decomp CPU s':>12}" + ("  build CPU s  wall" if args.builds
                                                         else ""))
        rows = []
        for level in levels:
            m = measure_level(shards, level, args.repeat)
            m.update(level=level, ratio=m["bytes"] / raw,
                     share=m["compress_cpu"] / (plain["cpu"] + m["compress_cpu"]))
            if args.builds:
                m["build"] = min((build(inputs, work / "z", f"zstd:{level}", args.workers)
                                  for _ in range(args.repeat)), key=lambda r: r["cpu"])
            rows.append(m)
            print(f"{level:>5} {100 * m['ratio']:>6.1f}% {m['bytes'] / 1e6:>7.1f} "
                  f"{m['compress_cpu']:>10.2f} {100 * m['share']:>7.1f}% "
                  f"{raw / 1e6 / max(m['compress_cpu'], 1e-9):>8.0f} {m['decompress_cpu']:>12.2f}"
                  + (f"  {m['build']['cpu']:>11.2f} {m['build']['wall']:>5.2f}" if args.builds
                     else ""))
        ours, others = watch.read()
        print("size: compressed / uncompressed shards; comp CPU s: compressing every shard "
              "(threads=-1, as mds_write.py); of build: that / (the uncompressed build's CPU + "
              "it); decomp: decompressing every shard once (a training epoch's, pack stats "
              f"--verify's). Other processes used {others:.2f} cores meanwhile.")
        if args.json:
            args.json.write_text(json.dumps({"checkout": describe_checkout(), "raw_bytes": raw,
                                             "shards": len(shards), "counts": tokens,
                                             "plain_build": plain, "levels": rows,
                                             "others_cores": others}, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
