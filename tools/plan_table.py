#!/usr/bin/env python
"""Which of DDP, FSDP, FSDP + activation checkpointing or hybrid sharding each preset needs, at
each sequence length and GPU count: the table in docs/TRAIN.md ("Memory plan").

Every cell is `train --dry-run --world-size N`'s own memory plan (training/fits.py:plan_memory
on a TrainConfig of the cell's flags, the model at its preset's vocabulary), tried in order of
cost until one fits --gpu-memory:

    1 GPU      DDP (one process); DDP + activation checkpointing (AC)
    8 GPUs     DDP, FSDP (8 shards); DDP + AC, FSDP + AC
    64 GPUs    DDP, hybrid (8 replicas of --node GPUs), FSDP (64 shards); then each + AC

Recomputation last (activation checkpointing adds about a third to the compute; FSDP's
all-gathers overlap it), and within each the least sharding first (DDP's one all-reduce; then
hybrid, whose all-gathers stay on a node's links and whose gradients are all-reduced across
nodes; then FSDP over every GPU). A cell says the first that
fits and its total per process; "none" when nothing fits (then fewer rows per micro-batch, a
shorter --seq or more GPUs). Rows per micro-batch: --rows (per sequence length), --precision
bf16 and AdamW unless told. It prints Markdown and exits 0.

    .venv/bin/python tools/plan_table.py [--seqs 2048,32768] [--rows 8,1] [--gpus 1,8,64]
        [--node 8] [--gpu-memory 80] [--precision bf16] [--optimizer adamw] [--models ...]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from longpack import archs  # noqa: E402
from longpack.archs.memory import GIB  # noqa: E402
from longpack.training.config import TrainConfig  # noqa: E402
from longpack.training.fits import plan_memory  # noqa: E402


def options(gpus: int, node: int) -> list[tuple[str, dict]]:
    """(name, TrainConfig flags) for `gpus` processes, cheapest first: without recomputation
    first, and within each, less sharding first."""
    shardings = [("DDP", {})]
    if gpus > node and gpus % node == 0:
        shardings.append((f"hybrid {gpus // node}x{node}",
                          {"fsdp": True, "fsdp_replicas": gpus // node}))
    if gpus > 1:
        shardings.append((f"FSDP/{gpus}", {"fsdp": True}))
    return shardings + [(name + "+AC", {**flags, "activation_checkpointing": True})
                        for name, flags in shardings]


def cell(model: str, seq: int, rows: int, gpus: int, node: int, gpu_memory: int, precision: str,
         optimizer: str) -> str:
    vocab = archs.config(model).vocab_size
    for name, flags in options(gpus, node):
        cfg = TrainConfig(shards="x", model=model, batch_size=rows, precision=precision,
                          optimizer=optimizer, **flags)
        total = plan_memory(cfg, vocab, seq, gpus)["total"]
        if total <= gpu_memory:
            gib = total / GIB
            return f"{name} {gib:.{1 if round(gib, 1) < 10 else 0}f}"
    return "none"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", default="2048,32768")
    ap.add_argument("--rows", default="8,1", help="rows per micro-batch at each --seqs")
    ap.add_argument("--gpus", default="1,8,64")
    ap.add_argument("--node", type=int, default=8, help="GPUs per node (hybrid's shard group)")
    ap.add_argument("--gpu-memory", type=float, default=80.0, help="GiB per GPU")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--optimizer", default="adamw")
    ap.add_argument("--models", default=",".join(archs.PRESETS))
    args = ap.parse_args()
    seqs = [int(s) for s in args.seqs.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    gpus = [int(g) for g in args.gpus.split(",")]
    head = [f"{s // 1024}k x {r}, {g} GPU{'s' * (g > 1)}" for s, r in zip(seqs, rows)
            for g in gpus]
    print("| preset | params | " + " | ".join(head) + " |")
    print("|---" * (len(head) + 2) + "|")
    for model in args.models.split(","):
        params = archs.footprint(model)["params"]
        cells = [cell(model, s, r, g, args.node, int(args.gpu_memory * GIB), args.precision,
                      args.optimizer) for s, r in zip(seqs, rows) for g in gpus]
        millions = f"{params / 1e6:,.{1 if params < 1e7 else 0}f}M"
        print(f"| {model} | {millions} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
