"""What merging a build split into tasks costs, as tasks and tokens grow (docs/SCALE.md).

Builds one synthetic corpus (FILES small jsonl files, a byte-level tokenizer, so tokenizing is
cheap and the merge shows) at two sizes, SCALE x apart, each split into 1, 10, 100 and 1,000
tasks that run one after another in this process (each places its own shards as it finishes,
as tasks on many machines do). Then times `pack merge` alone and reports what it wrote itself:
the shards that straddle tasks, against all the shards. Every merged build is checked against
the single-task one, byte for byte.

    python tools/sim_tasks.py [--files 1000] [--scale 4] [--tasks 1,10,100,1000]
                              [--packing best-fit|concat]   (pack build's default: best-fit)
"""

import argparse
import dataclasses
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from longpack.pipeline.config import PACKINGS, BuildConfig  # noqa: E402
from longpack.pipeline.distribute import tasks  # noqa: E402
from longpack.pipeline.distribute.work_folder import TaskedBuild  # noqa: E402


def byte_ranks(path: Path) -> str:
    import base64

    path.write_bytes(b"".join(base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(256)))
    return str(path)


def write_corpus(folder: Path, files: int, docs_per_file: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "long-context", "tokens", "merge", "shard"]
    folder.mkdir(parents=True)
    for f in range(files):
        lines = [json.dumps({"text": " ".join(rng.choice(words, int(rng.integers(20, 200))))})
                 for _ in range(docs_per_file)]
        (folder / f"part{f:05d}.jsonl").write_text("\n".join(lines) + "\n")


def digest(out: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name != "manifest.json":
            h.update(p.relative_to(out).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def run(corpus: Path, tokenizer: str, n: int, work: Path, packing: str) -> dict:
    out = work / f"out{n}"
    cfg = BuildConfig(out=str(out), dataset="jsonl", inputs=(str(corpus),), tokenizer=tokenizer,
                      tokenizer_engine="reference", seq=1024, val_fraction=0.01, workers=1,
                      shard_bytes=1024 * 2 * 16, tasks=n, packing=packing)
    t0 = time.perf_counter()
    for i in range(n):
        tasks.run_task(cfg, i, merge=False)
    t_tasks = time.perf_counter() - t0
    build = TaskedBuild(out)
    written, shards = 0, 0
    for split in ("train", "val"):
        layout = build.layout(split, n, final=True)  # the packing's (distribute/layout.py)
        placed = sum(len(build.placed(i)[split]) for i in range(n))
        written += layout.shards - placed
        shards += layout.shards
    t1 = time.perf_counter()
    m = tasks.merge(out)
    t_merge = time.perf_counter() - t1
    result = {"tasks": n, "tokens": m["counts"]["tokens"], "shards": shards,
              "merge_wrote": written, "tasks_s": t_tasks, "merge_s": t_merge,
              "digest": digest(out)}
    shutil.rmtree(out)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--scale", type=int, default=4)
    ap.add_argument("--tasks", default="1,10,100,1000")
    ap.add_argument("--packing", choices=PACKINGS,
                    default=next(f.default for f in dataclasses.fields(BuildConfig)
                                 if f.name == "packing"))
    args = ap.parse_args()
    counts = [int(x) for x in args.tasks.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tokenizer = byte_ranks(work / "gpt2.tiktoken")
        print(f"{'docs/file':>9} {'tasks':>6} {'tokens':>12} {'shards':>7} {'merge wrote':>11} "
              f"{'tasks s':>8} {'merge s':>8}  same bytes as 1 task")
        for docs_per_file in (2, 2 * args.scale):
            corpus = work / f"corpus{docs_per_file}"
            write_corpus(corpus, args.files, docs_per_file)
            first = None
            for n in counts:
                r = run(corpus, tokenizer, n, work, args.packing)
                first = first or r["digest"]
                print(f"{docs_per_file:>9} {n:>6} {r['tokens']:>12,} {r['shards']:>7} "
                      f"{r['merge_wrote']:>11} {r['tasks_s']:>8.2f} {r['merge_s']:>8.3f}  "
                      f"{'yes' if r['digest'] == first else 'NO'}", flush=True)


if __name__ == "__main__":
    main()
