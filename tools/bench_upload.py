#!/usr/bin/env python
"""`pack build --out s3://...` against the same build into a local folder, in the same run.

The corpus is bench_pack.py's (real FineWeb-Edu and Dolma documents as FineWeb-Edu parquet,
about --tokens GPT-2 tokens); the store is moto's S3 server in a process of its own on
127.0.0.1 (bench_common.s3_server), so uploads cross a real HTTP connection, not the network of
a cloud. Both builds run as `pack build` subprocesses with the same flags, alternating --repeat
times; the best wall time of each is kept. While the remote build runs, its staging folder's
size is sampled every 20 ms: the peak shows what bounded staging holds.

Reported: wall seconds of each, the ratio local / remote (1.0: uploading costs nothing, it
overlaps the build), the bytes uploaded and the staging peak against the output's size. The
upload's own CPU (sha256 + MD5 of every file, the HTTP client) runs in the build's process; the
server's CPU runs beside it on the same 2 cores, which a real store would not take.

    .venv/bin/python tools/bench_upload.py [--tokens 20e6] [--repeat 2] [--shard-bytes 16e6]
"""

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import (  # noqa: E402
    CpuWatch,
    clean_work,
    describe_checkout,
    pack_executable,
    s3_server,
    work_dir,
)
from bench_pack import GPT2_TIKTOKEN, make_corpus  # noqa: E402


def folder_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:  # removed while listed
            pass
    return total


def run(cmd: list[str], env: dict, staging: Path | None) -> dict:
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            if staging is not None and staging.exists():
                peak[0] = max(peak[0], folder_bytes(staging))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    watch = CpuWatch()
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    cpu, others = watch.read()
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return {"wall": wall, "cpu": cpu, "others": others, "staging_peak": peak[0]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path)
    p.add_argument("--tokens", type=float, default=20e6)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shard-bytes", type=float, default=16e6)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    work, made = work_dir(args.work, "bench_upload.")
    print(f"bench_upload: work {work}, --tokens {args.tokens:.3g}, --shard-bytes "
          f"{args.shard_bytes:.3g}, checkout {describe_checkout()}", flush=True)
    corpus = make_corpus(work / "corpus", args.tokens)
    flags = ["build", "--dataset", "fineweb-edu", "--input", str(corpus), "--tokenizer",
             str(GPT2_TIKTOKEN), "--seq", "8192", "--workers", str(args.workers), "--quiet",
             "--shard-bytes", str(int(args.shard_bytes))]
    best: dict[str, dict] = {}
    with s3_server() as env:
        for r in range(args.repeat):
            for name in ("local", "s3"):
                if name == "local":
                    cmd = [pack_executable(), *flags, "--out", str(work / f"local-{r}")]
                    staging = None
                else:
                    staging = work / "staging"
                    cmd = [pack_executable(), *flags, "--out", f"s3://bench/run-{r}",
                           "--staging", str(staging)]
                result = run(cmd, env, staging)
                print(f"  {name:<6} round {r}: {result['wall']:.2f} s wall, cpu "
                      f"{result['cpu']:.1f} s, others {result['others']:.2f} cores"
                      + (f", staging peak {result['staging_peak'] / 1e6:.1f} MB"
                         if staging else ""), flush=True)
                if name not in best or result["wall"] < best[name]["wall"]:
                    best[name] = result
    manifest = json.loads((work / "local-0" / "manifest.json").read_text())
    out_bytes = sum(s["bytes"] for s in manifest["splits"].values())
    shards = sum(s["shards"] for s in manifest["splits"].values())
    ratio = best["local"]["wall"] / best["s3"]["wall"]
    print(f"\noutput: {manifest['counts']['tokens']:,} tokens, {shards} shards, "
          f"{out_bytes / 1e6:.1f} MB")
    print(f"local {best['local']['wall']:.2f} s, s3 {best['s3']['wall']:.2f} s: the S3 build "
          f"runs at {ratio:.3f} of the local one's speed (best of {args.repeat})")
    print(f"staging peak {best['s3']['staging_peak'] / 1e6:.1f} MB = "
          f"{best['s3']['staging_peak'] / out_bytes:.2f} of the output")
    clean_work(work, made, args.keep, ["corpus", "staging"]
               + [f"local-{r}" for r in range(args.repeat)])


if __name__ == "__main__":
    main()
