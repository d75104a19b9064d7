#!/usr/bin/env python
"""The fastest any `pack build` of this design could be: read the parquet and encode, nothing else.

fastokens' `encode_batch_flat` takes Python strings only, so every build must at least read
each parquet file into Python strings and encode them. This tool times a process that does that
and no more, as the build does it: a fresh interpreter (its start, imports and loading fastokens
timed, as a build's are), one thread reading row batches of 1,000 into strings
(`iter_batches(use_threads=False).to_pylist()`, 2 x W batches ahead), W threads each calling
fastokens on a batch. No hashing, packing, checking, writing. In the same run, alternating:
fastokens' own ceiling as tools/bench_pack.py times it (texts already in memory, interpreter and
loading not timed) and the real `pack build --format memmap` and MDS. Prints each against the
ceiling and the build against the floor, best of --repeat.

If the floor itself is below a target ratio to the ceiling, no build of this design reaches it.

    .venv/bin/python tools/bench_build_floor.py [--work DIR] [--tokens 60e6] [--workers 2]
                                                [--repeat 3]
"""

import argparse
import json
import queue
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_pack  # noqa: E402  (the corpus, the ceiling and the build, measured the same way)
from bench_common import CpuWatch, describe_checkout, work_dir  # noqa: E402


def floor_child(corpus: Path, workers: int) -> None:
    """In the timed child: read and encode every document; print the ids counted."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    from longpack.pipeline.tokenize.engines import FastEngine
    from longpack.pipeline.tokenize.tokenizer import TIKTOKEN_ENCODINGS

    _, pattern, special = TIKTOKEN_ENCODINGS["gpt2"]
    engine = FastEngine.load("tiktoken", bench_pack.GPT2_TIKTOKEN, None, pattern, special)
    batches: queue.Queue = queue.Queue(2 * workers)

    def read():
        for path in sorted(corpus.glob("*.parquet")):
            for b in pq.ParquetFile(path).iter_batches(batch_size=1000, columns=["text"],
                                                        use_threads=False):
                batches.put(b.column(0).to_pylist())
        batches.put(None)

    threading.Thread(target=read, daemon=True).start()
    pool, futures, tokens = ThreadPoolExecutor(workers), [], 0
    while (texts := batches.get()) is not None:
        futures.append(pool.submit(lambda t: len(engine.encode_flat(t)[0]), texts))
        while len(futures) > 2 * workers:
            tokens += futures.pop(0).result()
    tokens += sum(f.result() for f in futures)
    print(json.dumps({"tokens": tokens}))


def run_floor(corpus: Path, workers: int) -> dict:
    watch = CpuWatch()
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--floor-child", "--corpus", str(corpus),
                          "--workers", str(workers)], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    cpu, others = watch.read()
    tokens = json.loads(out.stdout.strip().splitlines()[-1])["tokens"]
    return {"tokens": tokens, "wall": wall, "tps": tokens / wall, "cpu": cpu, "others": others}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=None)
    ap.add_argument("--tokens", type=float, default=60e6)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--floor-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor_child:
        floor_child(args.corpus, args.workers)
        return 0
    if args.workers < 1 or args.repeat < 1:
        ap.error("--workers and --repeat must be at least 1")
    if not args.tokens >= 1e5:  # NaN too; below that the fixed costs are the whole run
        ap.error(f"--tokens must be at least 1e5 (got {args.tokens})")
    work, _ = work_dir(Path(args.work) if args.work else None, "bench_build_floor.")
    corpus = work / "corpus"
    if not any(corpus.glob("*.parquet")):
        bench_pack.make_corpus(corpus, args.tokens)
    print(describe_checkout(), flush=True)
    env = dict(bench_pack.os.environ)
    runs: dict[str, list] = {"ceiling": [], "floor": [], "memmap": [], "mds": []}
    for i in range(args.repeat):
        runs["ceiling"].append(bench_pack.ceiling_in_subprocess("fastokens", corpus,
                                                                args.workers, env))
        runs["floor"].append(run_floor(corpus, args.workers))
        for fmt in ("memmap", "mds"):
            b = bench_pack.run_build(corpus, bench_pack.GPT2_TIKTOKEN, work / f"out-{fmt}",
                                     args.workers, env, ("--format", fmt,
                                                         "--tokenizer-engine", "fast"))
            if b["rc"] != 0:
                print(b["output"][-2000:])
                return 1
            runs[fmt].append({"tokens": b["text_tokens"], "wall": b["wall"],
                              "tps": b["e2e_tps"], "cpu": b["cpu"], "others": b["others"]})
        print(f"  run {i + 1}/{args.repeat}: " + ", ".join(
            f"{k} {v[-1]['tps'] / 1e6:.2f} M tok/s" for k, v in runs.items()), flush=True)
    best = {k: max(v, key=lambda r: r["tps"]) for k, v in runs.items()}
    tokens = {r["tokens"] for r in best.values()}
    ceiling = best["ceiling"]["tps"]
    print(f"\n== read + encode only, against fastokens' ceiling ({args.workers} workers; best of "
          f"{args.repeat}; {max(tokens):,} text tokens"
          f"{'' if len(tokens) == 1 else ' -- the counts differ: ' + str(sorted(tokens))})")
    print(f"  {'':34}{'seconds':>8}{'M tok/s':>9}{'x ceiling':>11}{'cpu s':>7}{'others':>8}")
    for name, label in (("ceiling", "fastokens alone (texts in memory)"),
                        ("floor", "floor: read + encode, whole process"),
                        ("memmap", "pack build, memmap"), ("mds", "pack build, MDS")):
        r = best[name]
        seconds = r.get("seconds", r.get("wall"))
        print(f"  {label:34}{seconds:8.2f}{r['tps'] / 1e6:9.2f}{r['tps'] / ceiling:11.3f}"
              f"{r['cpu']:7.1f}{r['others']:8.2f}")
    for fmt in ("memmap", "mds"):
        print(f"  pack build {fmt} / floor: {best[fmt]['tps'] / best['floor']['tps']:.3f}")
    print(f"  (resource: peak RSS of this process {resource.getrusage(0).ru_maxrss / 1e6:.2f} GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
