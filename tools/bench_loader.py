#!/usr/bin/env python
"""Benchmark the trainer's loader against the plain ways of reading the same shards.

What it measures, in one run:

1. Corpus. `longpack.pipeline.build` of the shared FineWeb-Edu sample with the shared gpt2.tiktoken at
   --seq (2048), val fraction 0, once as MDS (zstd) and once as memmap (~3,550 rows of real
   GPT-2 tokens at 2048). Every reader below reads the train split for --epochs epochs in a
   shuffled order, --batch rows per batch, and is run --repeat times; the best run counts.
2. memmap:
   - raw: this process maps every `shard.N.tokens.npy` (np.load mmap) and, per batch, stacks
     its rows (`np.stack([shard[r] ...])`) into one uint16 array: the ceiling;
   - loader: training.loader.batches (StepBatches over GlobalOrder, --workers processes writing
     into shared-memory slots), delivering what the trainer takes: the batch's tokens [batch,
     seq] in their stored dtype, where padding starts, and the document starts (the trainer
     widens them to int64 on its device). Each run opens the build afresh, so it pays what a
     training run pays once: every shard checked (sha256 against index.json, ids against the
     vocabulary: pipeline/builds/verify.py) before its rows are used;
   - loader, 0 workers: the same built in this process (for reference, not judged).
3. MDS (shards decompressed into each reader's own cache by one untimed warm-up epoch first):
   - streaming: a plain `streaming.StreamingDataset(shuffle=True)` in a torch DataLoader with the
     same --workers and --batch, collating only the `tokens` column;
   - loader: longpack.training.data.loader as above, reading rows through StreamingDataset.get_item (the
     check hashes each decompressed shard in the cache once per run).
Rates are rows (and tokens) delivered per second of wall clock.

4. --remote: the MDS build uploaded to a real S3 server (moto's, in a process of its own on
   127.0.0.1 at nice 19: bench_common.s3_server) and read by the same loader from its URL
   (`train --shards s3://...`): the manifest fetched and each shard downloaded into a cache of
   its own during an untimed warm-up epoch, then timed as the others (each run opens the
   build afresh, as a training run does: manifest fetched, every cached shard checked again).

5. --mix (instead of 2-4): the same documents as one build or as a mixture of two. The one
   build is the FineWeb-Edu sample's; the mixture is of its two parquet files built apart, as
   `train --shards a=... --shards b=... --mix a=0.5,b=0.5` draws them (longpack.training.data.mixture:
   MixedOrder over MixedRows, every batch from both, shuffled). Same format, steps and batch;
   rates in rows per second. (Same documents on both sides: what it costs to turn a row into a
   batch depends on the documents in it, e.g. how many start there.)

Targets: memmap loader >= 0.8 x raw; MDS loader >= 1.0 x plain StreamingDataset; --remote: the
loader from S3 >= 0.8 x the loader from the local folder once the cache is warm; --mix: the
loader over the mixture >= 0.95 x over the one build, per format. It prints a
table with PASS/FAIL and exits 0 whatever the figures are: a measuring tool, not a test.

    .venv/bin/python tools/bench_loader.py [--work DIR] [--seq 2048] [--batch 8] [--workers 2]
                                           [--epochs 20] [--repeat 3] [--remote | --mix]
"""

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_common import (  # noqa: E402
    SHARED,
    CpuWatch,
    build_shared_corpus,
    describe_checkout,
    s3_server,
    verdict,
    work_dir,
)


def timed(run) -> tuple[float, int, float]:
    """(seconds, rows, other processes' CPU in cores) of one call of run() -> rows."""
    watch = CpuWatch()
    t = time.perf_counter()
    rows = run()
    seconds = time.perf_counter() - t
    return seconds, rows, watch.read()[1]


def best_of_rounds(runs: dict, repeat: int) -> dict[str, float]:
    """Each run once a round, `repeat` rounds, the order rotated each round; every run printed,
    the best rows/s of each returned."""
    best = {}
    for r in range(repeat):
        names = list(runs)
        names = names[r % len(names):] + names[:r % len(names)]
        for name in names:
            seconds, rows, others = timed(runs[name])
            print(f"  round {r + 1} {name:<16} {rows / seconds:>10,.0f} rows/s "
                  f"({seconds:.2f} s, {rows} rows; others {others:.2f} cores)", flush=True)
            best[name] = max(best.get(name, 0.0), rows / seconds)
    return best


def raw_memmap(out: Path, order, steps: int):
    files = sorted((out / "train").glob("shard.*.tokens.npy"))
    shards = [np.load(f, mmap_mode="r") for f in files]
    bounds = np.concatenate([[0], np.cumsum([len(s) for s in shards])])

    def run():
        rows = 0
        for step in range(steps):
            ids = order.step_rows(step)
            k = np.searchsorted(bounds, ids, side="right") - 1
            batch = np.stack([shards[a][i - bounds[a]] for a, i in zip(k, ids)])
            rows += len(batch)
        return rows
    return run


def our_loader(open_rows, order, steps: int, batch: int, workers: int):
    """open_rows() opens the build's train rows: a run starts with no shard checked."""
    from longpack.training.data.loader import StepBatches, batches

    def run():
        data = StepBatches(order, open_rows(), rank=0, world=1, batch_size=batch, grad_accum=1)
        return sum(len(b["tokens"]) for b in batches(data, 0, steps, workers))
    return run


def plain_streaming(out: Path, cache: Path, epochs: int, batch: int, workers: int):
    import torch
    from torch.utils.data import DataLoader

    from longpack.pipeline.formats.streaming_compat import import_streaming

    streaming = import_streaming()
    dataset = streaming.StreamingDataset(remote=str(out / "train"), local=str(cache),
                                         shuffle=True, batch_size=batch, keep_zip=False)

    def collate(samples):
        return torch.from_numpy(np.stack([s["tokens"] for s in samples]))

    loader = DataLoader(dataset, batch_size=batch, num_workers=workers, collate_fn=collate,
                        persistent_workers=True)  # as ours: workers start once per run

    def run(n=epochs):
        return sum(len(b) for _ in range(n) for b in loader)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--remote", action="store_true", help="also the loader from an S3 server")
    ap.add_argument("--mix", action="store_true",
                    help="the loader over a mixture of two builds vs one build of them all")
    args = ap.parse_args()
    work, _ = work_dir(args.work, "bench_loader.")
    if args.mix:
        return measure_mix(args, work)
    with contextlib.ExitStack() as stack:
        if args.remote:
            os.environ.update(stack.enter_context(s3_server()))
        measure(args, work)


MIX = {"a": 0.5, "b": 0.5}  # the sources: the FineWeb-Edu sample's parquet files


def build_sources(work: Path, seq: int, fmt: str) -> dict[str, Path]:
    """The mixture's builds (kept in `work` and reused): each FineWeb-Edu parquet file apart,
    tokenized as build_shared_corpus's."""
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    parquet = sorted((SHARED / "data/fineweb-edu-sample").glob("*.parquet"))
    outs = {}
    for name, path in zip(MIX, parquet):
        out = work / f"{fmt}-{seq}-{name}"
        if not (out / "manifest.json").exists():
            build(BuildConfig(out=str(out), dataset="fineweb-edu", inputs=(str(path),),
                              tokenizer=str(SHARED / "tokenizers/gpt2.tiktoken"), seq=seq,
                              val_fraction=0.0, format=fmt), show_progress=False)
        outs[name] = out
    return outs


def measure_mix(args, work: Path) -> None:
    from longpack.pipeline.builds.reader import open_build
    from longpack.training.data.mixture import MixedOrder, MixedRows

    single = build_shared_corpus(work, args.seq)
    runs, rows_of, ratios = {}, {}, {}
    for fmt in ("memmap", "mds"):
        sources = build_sources(work, args.seq, fmt)
        cache = work / f"cache-mix-{fmt}"

        def open_one(fmt=fmt, cache=cache):
            return open_build(str(single[fmt]), cache, "100gb").train

        def open_mix(sources=sources, cache=cache):
            return MixedRows([open_build(str(p), cache, "100gb").train
                              for p in sources.values()])
        one = open_build(str(single[fmt]), cache, "100gb")
        parts = [open_build(str(p), cache, "100gb") for p in sources.values()]
        n = len(one.train)
        steps = args.epochs * n // args.batch
        # what the trainer's make_order gives: one source, or the two at MIX
        one_order = MixedOrder([(n, one.fingerprint)], [(0, np.ones(1))], args.batch, 0)
        mix_order = MixedOrder([(len(b.train), b.fingerprint) for b in parts],
                               [(0, np.array([MIX[k] for k in sources]))], args.batch, 0)
        runs[f"{fmt} one build"] = our_loader(open_one, one_order, steps, args.batch,
                                              args.workers)
        runs[f"{fmt} mixture"] = our_loader(open_mix, mix_order, steps, args.batch,
                                            args.workers)
        rows_of[fmt] = (n, sum(len(b.train) for b in parts))
        # warm-up (untimed), an epoch of each build: pages in, MDS shards decompressed
        for b in [one, *parts]:
            once = MixedOrder([(len(b.train), b.fingerprint)], [(0, np.ones(1))], args.batch, 0)
            our_loader(lambda b=b: b.train, once, len(b.train) // args.batch + 1, args.batch, 0)()
    best = best_of_rounds(runs, args.repeat)
    print(f"\nbench_loader --mix: batch {args.batch}, {args.workers} workers, "
          f"{args.epochs} epochs of the single build, rows of {args.seq}, best of "
          f"{args.repeat}; mixture {', '.join(f'{k}={w}' for k, w in MIX.items())}; "
          f"checkout {describe_checkout()}")
    print(f"{'reader':<18}{'rows':>8}{'rows/s':>12}{'tokens/s':>16}")
    for name, rate in best.items():
        fmt = name.split()[0]
        rows = rows_of[fmt][0 if name.endswith("one build") else 1]
        print(f"{name:<18}{rows:>8}{rate:>12,.0f}{rate * args.seq:>16,.0f}")
    print()
    for fmt in ("memmap", "mds"):
        ratios[fmt] = best[f"{fmt} mixture"] / best[f"{fmt} one build"]
        print(f"{fmt} loader, mixture / one build   {ratios[fmt]:.2f}  (target >= 0.95)  "
              f"{verdict(ratios[fmt] >= 0.95)}")
    print(f"work dir: {work}")


def upload(out: Path, url: str) -> None:
    from longpack.core import Store

    store = Store(url)
    for path in sorted(out.rglob("*")):
        if path.is_file():
            store.put_file(path, path.relative_to(out).as_posix())


def measure(args, work: Path) -> None:
    from longpack.pipeline.builds.reader import open_build
    from longpack.training.data.mixture import GlobalOrder

    outs = build_shared_corpus(work, args.seq)

    def opener(fmt: str, cache: str):
        return lambda: open_build(str(outs[fmt]), work / cache, "100gb").train

    mds = open_build(str(outs["mds"]), work / "cache-loader", "100gb")
    memmap = open_build(str(outs["memmap"]), work / "unused", "100gb")
    n = len(memmap.train)
    steps = args.epochs * n // args.batch
    order = GlobalOrder(n, args.batch, seed=0, fingerprint=memmap.fingerprint)
    mds_order = GlobalOrder(n, args.batch, seed=0, fingerprint=mds.fingerprint)

    runs = {
        "memmap raw": raw_memmap(outs["memmap"], order, steps),
        "memmap loader": our_loader(opener("memmap", "unused"), order, steps, args.batch,
                                    args.workers),
        "memmap 0 workers": our_loader(opener("memmap", "unused"), order, steps, args.batch, 0),
        "mds streaming": plain_streaming(outs["mds"], work / "cache-plain", args.epochs,
                                         args.batch, args.workers),
        "mds loader": our_loader(opener("mds", "cache-loader"), mds_order, steps, args.batch,
                                 args.workers),
    }
    if args.remote:
        url = "s3://bench/mds"
        upload(outs["mds"], url)
        remote = open_build(url, work / "cache-remote", "100gb")
        runs["mds loader s3"] = our_loader(
            lambda: open_build(url, work / "cache-remote", "100gb").train, mds_order, steps,
            args.batch, args.workers)
        our_loader(lambda: remote.train, mds_order, n // args.batch + 1, args.batch, 0)()
    # Warm-up (untimed): pages in, and each MDS reader decompresses into its cache.
    runs["mds streaming"](1)
    our_loader(lambda: mds.train, mds_order, n // args.batch + 1, args.batch, 0)()
    runs["memmap raw"]()
    best = best_of_rounds(runs, args.repeat)

    print(f"\nbench_loader: {n} rows x {args.seq} tokens, batch {args.batch}, "
          f"{args.workers} workers, {args.epochs} epochs, best of {args.repeat}; "
          f"checkout {describe_checkout()}")
    print(f"{'reader':<18}{'rows/s':>12}{'tokens/s':>16}")
    for name, rate in best.items():
        print(f"{name:<18}{rate:>12,.0f}{rate * args.seq:>16,.0f}")
    mm = best["memmap loader"] / best["memmap raw"]
    md = best["mds loader"] / best["mds streaming"]
    print(f"\nmemmap loader / raw memmap slicing       {mm:.2f}  (target >= 0.8)  {verdict(mm >= 0.8)}")
    print(f"MDS loader / plain StreamingDataset      {md:.2f}  (target >= 1.0)  {verdict(md >= 1.0)}")
    if args.remote:
        rs = best["mds loader s3"] / best["mds loader"]
        print(f"MDS loader from S3 / from the local folder  {rs:.2f}  (target >= 0.8, warm "
              f"cache)  {verdict(rs >= 0.8)}")
    print(f"work dir: {work}")


if __name__ == "__main__":
    main()
