#!/usr/bin/env python
"""What document masks cost each family's training step on the CPU (issue 57).

Per family (gpt-neox, moe with Mixture-of-Depths and a multi-token head, mamba, the hybrid,
resonance) at small widths (d 128, 2 layers, vocab 512, batch 1, fp32): seconds of a training
step (forward, chunked loss, backward) on rows of --seqs tokens with documents (lengths drawn
once, --doc-mean tokens on average, the same rows for every family) and on the same rows as
one document; steps alternate between the two for --rounds rounds, best of --repeat each.
Printed: masked / unmasked seconds per family, then resonance and Mamba against gpt-neox
(tokens/s ratios), masked and unmasked, all from the same run.

    .venv/bin/python tools/bench_doc_masks.py [--seqs 2048,8192] [--repeat 2] [--rounds 2]
                                               [--doc-mean 512] [--families neox,resonance]
"""

import argparse
import math
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ (the script runs from anywhere)
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # the checkout's longpack
from bench_archs import step_time  # noqa: E402  (a step timed as the zoo's benchmark does)
from bench_common import CpuWatch, describe_checkout  # noqa: E402

from longpack import archs  # noqa: E402

SHAPES = {  # equal width and depth; moe with the depth routing and extra head of the 5B design
    "neox": ("gpt-neox", dict(d_model=128, n_layers=2, n_heads=2, d_ff=512)),
    "moe": ("moe", dict(d_model=128, n_layers=2, n_heads=2, n_kv_heads=1, n_experts=4, top_k=2,
                        d_expert=256, mod_capacity=0.5, n_pred_tokens=2)),
    "mamba": ("mamba", dict(d_model=128, n_layers=2)),
    "hybrid": ("moe", dict(d_model=128, n_layers=2, n_heads=2, n_kv_heads=1, n_experts=4,
                           top_k=2, d_expert=256, layers="MA")),
    "resonance": ("resonance", dict(d_model=128, n_layers=2, num_frequencies=32)),
}


def document_starts(seq: int, mean: int, seed: int = 0) -> list[int]:
    """Starts of documents of exponentially distributed lengths (at least 1 token) filling a
    row of `seq`, the last one cut at the row's end: many short documents, a few long ones."""
    rng = random.Random(seed)
    starts, at = [], 0
    while at < seq:
        starts.append(at)
        at += 1 + int(rng.expovariate(1 / mean))
    return starts


def measure(model, seq: int, starts: list[int], repeat: int, rounds: int) -> tuple[float, float]:
    """Best seconds of a step with documents and without, alternating for `rounds` rounds."""
    cpu = torch.device("cpu")
    masked = unmasked = math.inf
    for _ in range(rounds):
        masked = min(masked, step_time(model, 1, seq, cpu, None, repeat, False,
                                       doc_starts=torch.tensor([starts])))
        unmasked = min(unmasked, step_time(model, 1, seq, cpu, None, repeat, False))
    return masked, unmasked


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", default="2048,8192")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--doc-mean", type=int, default=512, help="mean document length")
    ap.add_argument("--families", default=",".join(SHAPES))
    args = ap.parse_args()
    families = args.families.split(",")
    if not set(families) <= set(SHAPES):
        ap.error(f"--families: choose from {', '.join(SHAPES)} (got {args.families})")
    if args.repeat < 1 or args.rounds < 1:
        ap.error("--repeat and --rounds must be at least 1")
    seqs = [int(s) for s in args.seqs.split(",")]
    print(f"== CPU ({torch.get_num_threads()} threads), {describe_checkout()}, fp32, batch 1, "
          f"d 128, 2 layers, vocab 512: seconds of a training step (best of {args.repeat} x "
          f"{args.rounds} alternating rounds), documents of mean {args.doc_mean}", flush=True)
    watch = CpuWatch()
    seconds = {}  # (family, seq) -> (masked, unmasked)
    for seq in seqs:
        starts = document_starts(seq, args.doc_mean)
        print(f"  seq {seq}: {len(starts)} documents", flush=True)
        for name in families:
            family, shape = SHAPES[name]
            torch.manual_seed(0)
            model = archs.build(family, vocab_size=512, max_seq=seq, **shape)
            masked, unmasked = measure(model, seq, starts, args.repeat, args.rounds)
            seconds[name, seq] = masked, unmasked
            print(f"    {name:<10} masked {masked:8.4f} s, unmasked {unmasked:8.4f} s, "
                  f"masked/unmasked {masked / unmasked:5.2f}x", flush=True)
    if "neox" in families:
        print("\n== tokens/s against gpt-neox at the same width and depth (>1: faster)")
        for seq in seqs:
            for name in ("resonance", "mamba"):
                if name in families:
                    (m, u), (nm, nu) = seconds[name, seq], seconds["neox", seq]
                    print(f"  seq {seq:>5} {name:<10} masked {nm / m:5.2f}x, "
                          f"unmasked {nu / u:5.2f}x")
    ours, others = watch.read()
    print(f"\nCPU: ours {ours:.1f} s; other processes {others:.2f} cores on average")


if __name__ == "__main__":
    main()
