#!/usr/bin/env python
"""Benchmark `pack build --packing concat` against `--packing best-fit` (issue 53): how much of
the data each cuts, how much padding it costs, and how fast each builds.

What it does, for each corpus and each --seq:

1. Builds. `pack build --dataset D [--input PATH] --tokenizer T --seq S --format memmap
   --val-fraction 0 --workers W --quiet --packing P` runs as a subprocess for P = concat and
   best-fit, --repeat times, the two alternating (concat first in even rounds, best-fit first in
   odd ones, so neither always runs on a warmer machine). Before a corpus's first --seq, --warmup
   untimed builds bring its files into the page cache. Each build starts from an empty --out.
2. Speed. The wall clock of each `pack build` process, start to exit: reading, tokenizing,
   packing and writing, the interpreter's start included. Rates count text tokens (the
   manifest's `counts.tokens - counts.documents`: it counts one EOS per document), as
   tools/bench_pack.py does. Per packing the median rate over the repeats; best-fit's ratio to
   concat is the median of each round's best-fit rate over the same round's concat rate. Each
   build's "others" (cores' worth of CPU other processes used meanwhile, /proc/stat) says how
   disturbed it was. Beside it, the same ratio "after start-up": over the manifest's
   `timings.seconds - timings.startup_seconds` (from the first batch to the manifest: the main
   loop and the finish, where best-fit packs a split's last window), which leaves out the
   interpreter, the tokenizer's loading and the first batch, a fixed cost that weighs more the
   smaller the corpus.
3. Figures, from the last repeat's output, read by the parser below, which follows
   docs/FORMAT.md ("Memmap layout", "Segments", "Round trip") with numpy alone and imports
   nothing of longpack:
   - split share: tokens of documents whose pieces lie in two or more rows, over real tokens
     (every token that is not padding, each document's EOS included);
   - floor: tokens of documents longer than a row (more than `seq` tokens with their EOS, so
     they must be split), over real tokens;
   - padding share: padding tokens over all row tokens (rows x seq).
4. Checks (PASS/FAIL; any FAIL makes the exit status 1):
   - each build parses: index.json's sha256 and sizes match the files, each row has a segment at
     0, starts increase, padding is the row's last segment and all pad_id, EOS appears in a
     document only as its last token, a document without its EOS runs to its row's end and goes
     on at offset 0 of the next row with the same hash, every document ends;
   - the parsed totals equal the manifest's (tokens, documents, padding) and rows x seq;
   - every document is present exactly once: the multiset of (document hash, length, BLAKE2b of
     its tokens reassembled in row order) is the same for concat and best-fit;
   - where the input has a `token_count` column (FineWeb-Edu's schema), the multiset of document
     lengths equals that of token_count + 1, the input's own count, not longpack's;
   - the repeats of each build wrote the same bytes (their index.json, which holds each file's
     sha256).

At --seq 32768 it also prints issue 53's "Done when" figures against their targets: best-fit's
split share within 1 point of the floor, padding at most 1% of row tokens, best-fit at least 0.8x
concat's speed.

    .venv/bin/python tools/bench_packing.py [--corpus sample] [--corpus DIR ...]
        [--seqs 2048,8192,32768] [--repeat 3] [--warmup 1] [--workers 2] [--tokenizer T]
        [--work DIR] [--keep] [--json FILE] [--copies N]

`--corpus sample` is the FineWeb-Edu sample shipped with longpack (`--dataset
fineweb-edu-sample`); any other value is a folder of FineWeb-Edu-schema parquet (`--dataset
fineweb-edu --input DIR`). Default: the shipped sample and ../shared/data/fineweb-edu-sample.
The tokenizer defaults to ../shared/tokenizers/gpt2.tiktoken, or `gpt2` (which falls back to
the ranks shipped with longpack) where that file is absent.
"""

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from bench_common import (  # noqa: E402
    ROOT,
    SHARED,
    CpuWatch,
    clean_work,
    describe_checkout,
    linked_copies,
    pack_executable,
    verdict,
    work_dir,
)

PACKINGS = ("concat", "best-fit")
SHIPPED_SAMPLE = ROOT / "pipeline" / "samples" / "fineweb-edu-sample"
DEFAULT_TOKENIZER = SHARED / "tokenizers" / "gpt2.tiktoken"
DONE_SEQ = 32768  # issue 53's targets are stated at this row length
TARGET_SPLIT_OVER_FLOOR = 0.01  # best-fit's split share at most 1 point above the floor
TARGET_PADDING = 0.01
TARGET_SPEED = 0.8


# ---------------------------------------------------------------- the independent parser

@dataclass
class Parsed:
    """A build read back: its documents (hash, length, digest, rows spanned) and totals."""
    seq: int
    rows: int = 0
    padding: int = 0
    docs: list = field(default_factory=list)  # (hash, length, digest hex, rows spanned)
    problems: list = field(default_factory=list)

    @property
    def real(self) -> int:
        return sum(d[1] for d in self.docs)

    def figures(self) -> dict:
        real = self.real
        split = sum(d[1] for d in self.docs if d[3] >= 2)
        floor = sum(d[1] for d in self.docs if d[1] > self.seq)
        return {"rows": self.rows, "documents": len(self.docs), "real_tokens": real,
                "padding_tokens": self.padding,
                "split_documents": sum(1 for d in self.docs if d[3] >= 2),
                "split_share": split / real if real else 0.0,
                "floor_share": floor / real if real else 0.0,
                "padding_share": self.padding / (self.rows * self.seq) if self.rows else 0.0}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parse_split(folder: Path, seq: int, eos: int, out: Parsed) -> None:
    """Read one memmap split (docs/FORMAT.md) into `out`: documents are reassembled across rows
    and shards; anything that breaks the format is a line in `out.problems`."""
    index_path = folder / "index.json"
    if not index_path.exists():
        return  # a split with no rows may have no index
    index = json.loads(index_path.read_text())
    if index.get("format") != "longpack-memmap" or index.get("seq") != seq:
        out.problems.append(f"{index_path}: not a longpack-memmap index of seq {seq}")
        return
    open_doc = None  # [hash, length, blake2b, first row, last row] of a document without its EOS
    row0 = out.rows
    for n, shard in enumerate(index["shards"]):
        where = f"{folder.name}/shard {n}"
        for part in ("tokens", "docs"):
            path = folder / shard[part]["basename"]
            if path.stat().st_size != shard[part]["bytes"] or sha256_of(path) != shard[part][
                    "sha256"]:
                out.problems.append(f"{where}: {part} file differs from index.json")
        tokens = np.load(folder / shard["tokens"]["basename"], mmap_mode="r", allow_pickle=False)
        segs = np.load(folder / shard["docs"]["basename"], allow_pickle=False)
        if (tokens.shape != (shard["rows"], seq) or tokens.dtype != np.dtype(index["dtype"])
                or not tokens.flags.c_contiguous or segs.dtype != np.uint64
                or segs.shape != (shard["segments"], 3)):
            out.problems.append(f"{where}: shapes or dtypes not as index.json says")
            continue
        rows, starts, hashes = segs[:, 0].astype(np.int64), segs[:, 1].astype(np.int64), segs[:, 2]
        order_ok = np.all((np.diff(rows) > 0) | ((np.diff(rows) == 0) & (np.diff(starts) > 0)))
        firsts = np.flatnonzero(np.r_[True, np.diff(rows) != 0])
        if (not order_ok or len(firsts) != shard["rows"]
                or not np.array_equal(rows[firsts], np.arange(shard["rows"]))
                or np.any(starts[firsts] != 0) or np.any(starts >= seq)):
            out.problems.append(f"{where}: segments not sorted, or a row without one at 0")
            continue
        ends = np.r_[starts[1:], seq]
        ends[np.r_[firsts[1:] - 1, len(starts) - 1]] = seq  # each row's last segment
        for row, start, end, h in zip(rows.tolist(), starts.tolist(), ends.tolist(),
                                      hashes.tolist()):
            piece = np.asarray(tokens[row, start:end])
            here = f"{where} row {row} offset {start}"
            if h == 0:
                if end != seq or np.any(piece != eos):
                    out.problems.append(f"{here}: padding not the row's end, or not pad_id")
                if open_doc is not None:
                    out.problems.append(f"{here}: padding where a cut document should go on")
                    open_doc = None
                out.padding += end - start
                continue
            if np.any(piece[:-1] == eos):
                out.problems.append(f"{here}: EOS inside a segment")
            global_row = row0 + row
            if open_doc is not None:
                if start != 0 or global_row != open_doc[4] + 1 or h != open_doc[0]:
                    out.problems.append(f"{here}: a document cut at a row end does not go on "
                                        "here with its hash")
                    open_doc = None
            if open_doc is None:
                open_doc = [h, 0, hashlib.blake2b(digest_size=16), global_row, global_row]
            open_doc[1] += len(piece)
            open_doc[2].update(piece.astype("<u4").tobytes())
            open_doc[4] = global_row
            if piece[-1] == eos:
                out.docs.append((h, open_doc[1], open_doc[2].hexdigest(),
                                 open_doc[4] - open_doc[3] + 1))
                open_doc = None
            elif end != seq:
                out.problems.append(f"{here}: a segment without EOS that stops before the row end")
        row0 += shard["rows"]
    if open_doc is not None:
        out.problems.append(f"{folder.name}: its last document has no EOS")
    if row0 - out.rows != index.get("rows"):
        out.problems.append(f"{index_path}: rows differ from its shards'")
    out.rows = row0


def parse_build(out_dir: Path) -> Parsed:
    """A memmap build: its splits read as one (train then val), checked against the manifest."""
    manifest = json.loads((out_dir / "manifest.json").read_text())
    seq, eos = manifest["seq"], manifest["pad_id"]
    parsed = Parsed(seq=seq)
    for split in ("train", "val"):
        parse_split(out_dir / split, seq, eos, parsed)
    splits = manifest["splits"].values()
    want = {"tokens": manifest["counts"]["tokens"], "documents": manifest["counts"]["documents"],
            "padding": sum(s["padding_tokens"] for s in splits),
            "rows": sum(s["rows"] for s in splits)}
    got = {"tokens": parsed.real, "documents": len(parsed.docs), "padding": parsed.padding,
           "rows": parsed.rows}
    if got != want:
        parsed.problems.append(f"parsed {got}, the manifest says {want}")
    if parsed.real + parsed.padding != parsed.rows * seq:
        parsed.problems.append("real + padding tokens != rows x seq")
    return parsed


def input_lengths(folder: Path | None) -> Counter | None:
    """Document lengths the input itself gives (token_count + the EOS), if it has the column."""
    if folder is None:
        return None
    import pyarrow.parquet as pq

    counts = Counter()
    for path in sorted(folder.glob("*.parquet")):
        if "token_count" not in pq.read_schema(path).names:
            return None
        counts.update((pq.read_table(path, columns=["token_count"]).column("token_count")
                       .to_numpy() + 1).tolist())
    return counts


# ------------------------------------------------------------------------------- the builds

def build_command(corpus: str, seq: int, packing: str, out: Path, args) -> list[str]:
    source = (["--dataset", "fineweb-edu-sample"] if corpus == "sample"
              else ["--dataset", "fineweb-edu", "--input", corpus])
    return [pack_executable(), "build", "--out", str(out), *source, "--tokenizer", args.tokenizer,
            "--seq", str(seq), "--format", "memmap", "--val-fraction", "0", "--workers",
            str(args.workers), "--packing", packing, "--quiet"]


def run_build(cmd: list[str], out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    watch = CpuWatch()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    _cpu, others = watch.read()
    if proc.returncode != 0:
        sys.exit(f"pack build failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
    manifest = json.loads((out / "manifest.json").read_text())
    text_tokens = manifest["counts"]["tokens"] - manifest["counts"]["documents"]
    index = b"".join((out / s / "index.json").read_bytes() for s in ("train", "val")
                     if (out / s / "index.json").exists())
    t = manifest["timings"]
    return {"seconds": wall, "rate": text_tokens / wall, "others": others,
            "rate_after_startup": text_tokens / (t["seconds"] - t["startup_seconds"]),
            "engine": manifest.get("tokenizer_engine", {}).get("engine"),
            "index_sha256": hashlib.sha256(index).hexdigest()}


def measure(corpus: str, seq: int, work: Path, args) -> dict:
    name = "sample" if corpus == "sample" else Path(corpus).name
    outs = {p: work / f"{name}-{seq}-{p}" for p in PACKINGS}
    runs = {p: [] for p in PACKINGS}
    for r in range(args.repeat):
        for p in (PACKINGS if r % 2 == 0 else PACKINGS[::-1]):
            runs[p].append(run_build(build_command(corpus, seq, p, outs[p], args), outs[p]))
    result = {"corpus": corpus, "seq": seq, "packings": {}}
    for p in PACKINGS:
        parsed = parse_build(outs[p])
        result["packings"][p] = {
            **parsed.figures(), "problems": parsed.problems,
            "rate_median": statistics.median(x["rate"] for x in runs[p]),
            "runs": runs[p], "same_bytes": len({x["index_sha256"] for x in runs[p]}) == 1,
            "multiset": Counter((h, n, d) for h, n, d, _ in parsed.docs),
            "lengths": Counter(n for _, n, _, _ in parsed.docs)}
    ratios = [b["rate"] / c["rate"] for c, b in zip(runs["concat"], runs["best-fit"])]
    result["ratio_median"] = statistics.median(ratios)
    result["ratios"] = ratios
    result["ratio_after_startup_median"] = statistics.median(
        b["rate_after_startup"] / c["rate_after_startup"]
        for c, b in zip(runs["concat"], runs["best-fit"]))
    return result


def checks(result: dict, reference: Counter | None) -> dict:
    c, b = result["packings"]["concat"], result["packings"]["best-fit"]
    out = {"parsed": not c["problems"] and not b["problems"],
           "same_documents": c["multiset"] == b["multiset"],
           "same_bytes_on_repeat": c["same_bytes"] and b["same_bytes"]}
    if reference is not None:
        out["lengths_match_input"] = c["lengths"] == reference == b["lengths"]
    return out


# ---------------------------------------------------------------------------------- report

def pct(x: float) -> str:
    return f"{100 * x:6.2f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", action="append", help="sample, or a folder of parquet "
                    "(repeatable) [sample and ../shared/data/fineweb-edu-sample]")
    ap.add_argument("--seqs", default="2048,8192,32768")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed builds per corpus")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER) if DEFAULT_TOKENIZER.exists()
                    else "gpt2")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--copies", type=int, default=1, help="read each corpus folder N times "
                    "over (its files linked N times under new names): a larger corpus of the "
                    "same documents, whose 32k build spans several of best-fit's windows")
    args = ap.parse_args()
    if args.repeat < 1 or args.copies < 1:
        ap.error("--repeat and --copies must be at least 1")
    corpora = args.corpus or ["sample", str(SHARED / "data" / "fineweb-edu-sample")]
    for corpus in corpora:
        if corpus != "sample" and not Path(corpus).is_dir():
            sys.exit(f"no corpus folder {corpus}")
    seqs = [int(s) for s in args.seqs.split(",")]
    work, made_here = work_dir(args.work, "bench_packing.")
    if args.copies > 1:
        corpora = [c if c == "sample" else
                   str(linked_copies(Path(c), args.copies, work / f"{Path(c).name}-x{args.copies}"))
                   for c in corpora]
    print(f"checkout {describe_checkout()}; tokenizer {args.tokenizer}; workers {args.workers}; "
          f"repeat {args.repeat}; memmap; val fraction 0")
    results, all_ok = [], True
    for corpus in corpora:
        reference = input_lengths(SHIPPED_SAMPLE if corpus == "sample" else Path(corpus))
        for _ in range(args.warmup):
            run_build(build_command(corpus, seqs[0], "concat", work / "warmup", args),
                      work / "warmup")
        for seq in seqs:
            result = measure(corpus, seq, work, args)
            result["checks"] = checks(result, reference)
            all_ok &= all(result["checks"].values())
            results.append(result)
            report(result)
    if any(result["seq"] == DONE_SEQ for result in results):
        print("\nissue 53, done when (at --seq 32768):")
    for result in results:
        if result["seq"] != DONE_SEQ:
            continue
        b = result["packings"]["best-fit"]
        over = b["split_share"] - b["floor_share"]
        print(f"  {result['corpus']}:\n"
              f"    best-fit split share - floor = {100 * over:.2f} points (<= 1): "
              f"{verdict(over <= TARGET_SPLIT_OVER_FLOOR)}\n"
              f"    best-fit padding {pct(b['padding_share']).strip()} of row tokens (<= 1%): "
              f"{verdict(b['padding_share'] <= TARGET_PADDING)}\n"
              f"    best-fit / concat speed {result['ratio_median']:.3f} (>= 0.8): "
              f"{verdict(result['ratio_median'] >= TARGET_SPEED)}\n"
              f"    every document's tokens present once: "
              f"{verdict(all(result['checks'].values()))}")
    if args.json:
        for result in results:
            for p in result["packings"].values():
                p.pop("multiset")
                p.pop("lengths")
        args.json.write_text(json.dumps({"checkout": describe_checkout(), "results": results},
                                        indent=1, default=str))
    clean_work(work, made_here, args.keep,
               [f"{'sample' if c == 'sample' else Path(c).name}-{s}-{p}" for c in corpora
                for s in seqs for p in PACKINGS] + ["warmup"]
               + [Path(c).name for c in corpora if args.copies > 1 and c != "sample"])
    return 0 if all_ok else 1


def report(result: dict) -> None:
    c = result["packings"]["concat"]
    lengths = sorted(c["lengths"].elements()) or [0]
    print(f"\n{result['corpus']}, seq {result['seq']}: {c['documents']:,} documents, "
          f"{c['real_tokens']:,} tokens with their EOS (median {lengths[len(lengths) // 2]:,}, "
          f"p99 {lengths[int(0.99 * (len(lengths) - 1))]:,}, max {lengths[-1]:,})")
    print(f"  {'packing':8s} {'rows':>7s} {'split docs':>10s} {'split share':>11s} "
          f"{'floor':>7s} {'padding':>7s} {'M tok/s':>8s} {'others':>6s}")
    for name, p in result["packings"].items():
        print(f"  {name:8s} {p['rows']:7,d} {p['split_documents']:10,d} "
              f"{pct(p['split_share']):>11s} {pct(p['floor_share'])} {pct(p['padding_share'])} "
              f"{p['rate_median'] / 1e6:8.2f} {max(x['others'] for x in p['runs']):6.2f}")
        for line in p["problems"][:5]:
            print(f"    problem: {line}")
    runs = "  ".join(f"{x:.3f}" for x in result["ratios"])
    print(f"  best-fit / concat speed: {result['ratio_median']:.3f} (median; rounds: {runs}); "
          f"after start-up {result['ratio_after_startup_median']:.3f}; "
          f"engine {c['runs'][0]['engine']}")
    print("  checks: " + ", ".join(f"{k} {verdict(v)}" for k, v in result["checks"].items()))


if __name__ == "__main__":
    sys.exit(main())
