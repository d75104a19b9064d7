#!/usr/bin/env python
"""Benchmark `pack build` throughput against the tokenizer's own ceiling on the same cores.

What it measures, in one run:

1. Corpus. It writes a real-text corpus of about --tokens GPT-2 tokens (default 60 M, ~200 MB of
   text) as parquet files in the FineWeb-Edu schema (zstd, row groups of 1000 rows, ~32 MB of
   text per file). The texts are the real documents in /work/shared/data/fineweb-edu-sample and
   /work/shared/data/dolma-sample, cycled (each pass in its own shuffled order) until the
   character budget, estimated at TOKENS_PER_CHAR tokens per character, is reached. The true
   token count is the one the build reports in its manifest.
2. Ceiling. All texts are loaded into memory (not timed), then one call of
   `enc.encode_ordinary_batch(texts, num_threads=W)` is timed for the GPT-2 tiktoken encoding
   loaded offline. This is the fastest the tokenizer alone turns these texts into token ids on
   W threads (converting the ids to Python lists is part of it).
3. Build. `pack build --dataset fineweb-edu --input CORPUS --tokenizer gpt2.tiktoken --seq 32768
   --workers W --quiet` runs as a subprocess; its wall clock (start-up included) is timed and the
   RSS of its whole process tree is sampled every ~50 ms for the peak. The manifest gives the
   tokens packed (`counts.tokens`, one EOS per document included: text tokens are
   counts.tokens - counts.documents, and those are what is compared with the ceiling) and the
   build's own steady-state time of its main loop (`timings.steady_seconds`, start-up excluded).
4. Optionally (--hf, on by default when `tokenizers` is installed) the same comparison for the
   Hugging Face tokenizer gpt-neox-tokenizer.json on a smaller corpus (--hf-tokens): ceiling =
   `Tokenizer.encode_batch_fast(texts, add_special_tokens=False)` with RAYON_NUM_THREADS=W.

Targets: end-to-end text tokens/s >= 0.85 x ceiling, steady-state >= 0.9 x ceiling, peak tree RSS
<= 1.5 GiB (and HF end-to-end >= 0.85 x its ceiling). It prints a table with PASS/FAIL per target
and exits 0 whatever the figures are: it is a measuring tool, not a test.

    .venv/bin/python tools/bench_pack.py [--work DIR] [--tokens 60e6] [--workers 2] [--no-hf]
"""

import argparse
import gc
import gzip
import importlib.util
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SHARED = Path("/work/shared")
FINEWEB_SAMPLE = SHARED / "data" / "fineweb-edu-sample"
DOLMA_SAMPLE = SHARED / "data" / "dolma-sample"
GPT2_TIKTOKEN = SHARED / "tokenizers" / "gpt2.tiktoken"
NEOX_JSON = SHARED / "tokenizers" / "gpt-neox-tokenizer.json"

# GPT-2 tokens per character of these texts (7.27 M / 25.3 M chars for the FineWeb-Edu sample):
# only used to decide how much text to write; the true count comes from the manifest.
TOKENS_PER_CHAR = 0.29
FILE_CHARS = 32 << 20  # text per parquet file: small FineWeb-like shards, several per corpus
ROW_GROUP_ROWS = 1000  # as in the FineWeb-Edu sample files
SEQ = 32768
RSS_INTERVAL = 0.05  # seconds between samples of the process tree's RSS
GIB = 1 << 30

TARGET_E2E = 0.85
TARGET_STEADY = 0.90
TARGET_RSS_GIB = 1.5

# The FineWeb-Edu schema; Dolma documents leave the columns they have no value for null.
SCHEMA = pa.schema([
    ("text", pa.string()), ("id", pa.string()), ("dump", pa.string()), ("url", pa.string()),
    ("file_path", pa.string()), ("language", pa.string()), ("language_score", pa.float64()),
    ("token_count", pa.int64()), ("score", pa.float64()), ("int_score", pa.int64()),
])


# ---------------------------------------------------------------------------------------- corpus

def read_fineweb_sample() -> list[dict]:
    rows = []
    for path in sorted(FINEWEB_SAMPLE.glob("*.parquet")):
        rows += pq.read_table(path).select(SCHEMA.names).to_pylist()
    return rows


def open_jsonl(path: Path) -> io.TextIOBase:
    """A text stream over a Dolma .json(l).gz / .jsonl.zst file."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    if path.suffix == ".zst":
        import zstandard
        raw = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
        return io.TextIOWrapper(raw, encoding="utf-8")
    return open(path, encoding="utf-8")


def read_dolma_sample() -> list[dict]:
    rows = []
    for path in sorted(DOLMA_SAMPLE.iterdir()):
        if not path.name.endswith((".gz", ".zst", ".jsonl", ".json")):
            continue
        with open_jsonl(path) as f:
            for line in f:
                if line.strip():
                    doc = json.loads(line)
                    rows.append({"text": doc["text"], "id": str(doc.get("id")),
                                 "dump": doc.get("source"), "language": "en"})
    return rows


def corpus_rows(target_chars: int):
    """Yield documents, cycling over all sample documents until target_chars are yielded.

    Each pass has its own shuffle so files mix both sources, and its own ids so that no two
    documents share one (the texts repeat, which a tokenizer without a cache does not notice).
    """
    base = read_fineweb_sample() + read_dolma_sample()
    chars, rep = 0, 0
    while chars < target_chars:
        order = list(range(len(base)))
        random.Random(rep).shuffle(order)
        for i in order:
            row = {**base[i], "id": f"{base[i]['id']}/rep{rep}"}
            yield row
            chars += len(row["text"])
            if chars >= target_chars:
                return
        rep += 1


def write_corpus(out: Path, target_tokens: float) -> dict:
    """Write parquet files of ~FILE_CHARS characters each into `out`; return a summary."""
    out.mkdir(parents=True, exist_ok=True)
    target_chars = int(target_tokens / TOKENS_PER_CHAR)
    files, docs, chars = [], 0, 0
    pending, pending_chars = [], 0

    def flush():
        path = out / f"000_{len(files):05d}.parquet"
        table = pa.Table.from_pylist(pending, schema=SCHEMA)
        pq.write_table(table, path, compression="zstd", row_group_size=ROW_GROUP_ROWS)
        files.append(path)

    for row in corpus_rows(target_chars):
        pending.append(row)
        pending_chars += len(row["text"])
        docs += 1
        chars += len(row["text"])
        if pending_chars >= FILE_CHARS:
            flush()
            pending, pending_chars = [], 0
    if pending:
        flush()
    disk = sum(p.stat().st_size for p in files)
    return {"dir": out, "files": len(files), "documents": docs, "chars": chars, "disk_bytes": disk}


def load_texts(corpus: Path) -> list[str]:
    texts = []
    for path in sorted(corpus.glob("*.parquet")):
        texts += pq.read_table(path, columns=["text"]).column("text").to_pylist()
    return texts


# --------------------------------------------------------------------------------------- ceiling

def gpt2_encoding():
    import tiktoken
    import tiktoken.load
    import tiktoken_ext.openai_public
    return tiktoken.Encoding(
        name="gpt2", pat_str=tiktoken_ext.openai_public.r50k_pat_str,
        mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(GPT2_TIKTOKEN)),
        special_tokens={"<|endoftext|>": 50256})


def ceiling_tiktoken(corpus: Path, workers: int) -> dict:
    texts = load_texts(corpus)
    enc = gpt2_encoding()
    t0 = time.perf_counter()
    results = enc.encode_ordinary_batch(texts, num_threads=workers)
    seconds = time.perf_counter() - t0
    tokens = sum(len(r) for r in results)
    del results, texts  # gigabytes of Python ints: gone before the build runs beside us
    gc.collect()
    return {"tokens": tokens, "seconds": seconds, "tps": tokens / seconds}


def ceiling_hf(corpus: Path, workers: int) -> dict:
    # Rayon reads its thread count once, when the tokenizers library starts its pool.
    os.environ["RAYON_NUM_THREADS"] = str(workers)
    import tokenizers
    texts = load_texts(corpus)
    tok = tokenizers.Tokenizer.from_file(str(NEOX_JSON))
    t0 = time.perf_counter()
    results = tok.encode_batch_fast(texts, add_special_tokens=False)
    seconds = time.perf_counter() - t0
    tokens = sum(len(r) for r in results)
    del results, texts
    gc.collect()
    return {"tokens": tokens, "seconds": seconds, "tps": tokens / seconds}


# ----------------------------------------------------------------------------------------- build

def tree_pids(root: int) -> list[int]:
    """root and all its descendants, from /proc/PID/task/TID/children."""
    pids, stack = [], [root]
    while stack:
        pid = stack.pop()
        pids.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    stack += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass  # exited between listing and reading
    return pids


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0  # gone, or a zombie (no VmRSS line)


class TreeRssSampler(threading.Thread):
    """Samples the summed VmRSS of a process tree every RSS_INTERVAL until stopped."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.samples = pid, 0, 0
        self._stop_event = threading.Event()

    def run(self):
        while not self._stop_event.is_set():
            self.peak = max(self.peak, sum(rss_bytes(p) for p in tree_pids(self.pid)))
            self.samples += 1
            self._stop_event.wait(RSS_INTERVAL)

    def stop(self):
        self._stop_event.set()
        self.join()


def pack_executable() -> str:
    """The `pack` script beside this interpreter (the project venv), else the one on PATH."""
    here = Path(sys.executable).parent / "pack"
    return str(here) if here.exists() else (shutil.which("pack") or "pack")


def run_build(corpus: Path, tokenizer: Path, out: Path, workers: int, env: dict,
              extra: tuple = ()) -> dict:
    cmd = [pack_executable(), "build", "--dataset", "fineweb-edu", "--input", str(corpus),
           "--tokenizer", str(tokenizer), "--seq", str(SEQ), "--out", str(out),
           "--workers", str(workers), "--quiet", *extra]
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sampler = TreeRssSampler(proc.pid)
    sampler.start()
    output = proc.communicate()[0].decode("utf-8", "replace")
    wall = time.perf_counter() - t0
    sampler.stop()
    result = {"cmd": cmd, "rc": proc.returncode, "wall": wall, "peak_rss": sampler.peak,
              "rss_samples": sampler.samples, "output": output}
    manifest = out / "manifest.json"
    if proc.returncode == 0 and manifest.exists():
        m = json.loads(manifest.read_text())
        c, t = m["counts"], m["timings"]
        text_tokens = c["tokens"] - c["documents"]
        steady = t.get("steady_seconds")
        result.update(
            tokens=c["tokens"], documents=c["documents"], text_tokens=text_tokens,
            skipped={k: v for k, v in c["skipped"].items() if v}, steady_seconds=steady,
            steady_tps_manifest=t.get("steady_tokens_per_second"),
            startup_seconds=t.get("startup_seconds"),
            e2e_tps=text_tokens / wall,
            steady_tps=text_tokens / steady if steady else None,
            out_bytes=sum(s["bytes"] for s in m["splits"].values()))
    return result


# ---------------------------------------------------------------------------------------- report

def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def report_pair(title: str, ceiling: dict, build: dict, check_steady: bool) -> list[tuple]:
    """Print one tokenizer's table; return its (target, value, verdict) rows."""
    print(f"\n== {title}")
    print(f"  {'':34}{'tokens':>14}{'seconds':>10}{'M tok/s':>10}{'x ceiling':>11}")
    print(f"  {'ceiling (tokenizer alone)':34}{ceiling['tokens']:>14,}"
          f"{ceiling['seconds']:>10.2f}{ceiling['tps'] / 1e6:>10.3f}{1:>11.3f}")
    if build["rc"] != 0 or "tokens" not in build:
        print(f"  pack build FAILED (rc {build['rc']}) after {build['wall']:.1f} s:\n"
              f"    {' '.join(build['cmd'])}\n" + build["output"][-4000:])
        return [(f"{title}: build ran", "rc " + str(build["rc"]), "FAIL")]
    e2e = build["e2e_tps"] / ceiling["tps"]
    print(f"  {'pack build end to end (wall)':34}{build['text_tokens']:>14,}"
          f"{build['wall']:>10.2f}{build['e2e_tps'] / 1e6:>10.3f}{e2e:>11.3f}")
    rows = [(f"{title}: end to end >= {TARGET_E2E} x ceiling", f"{e2e:.3f}",
             verdict(e2e >= TARGET_E2E))]
    if build["steady_tps"]:
        steady = build["steady_tps"] / ceiling["tps"]
        print(f"  {'pack build steady state':34}{build['text_tokens']:>14,}"
              f"{build['steady_seconds']:>10.2f}{build['steady_tps'] / 1e6:>10.3f}"
              f"{steady:>11.3f}")
        if check_steady:
            rows.append((f"{title}: steady state >= {TARGET_STEADY} x ceiling", f"{steady:.3f}",
                         verdict(steady >= TARGET_STEADY)))
    rss = build["peak_rss"] / GIB
    print(f"  text tokens = counts.tokens {build['tokens']:,} - documents {build['documents']:,}"
          f" (one EOS each); skipped {build['skipped'] or 0}; start-up "
          f"{build['startup_seconds'] or 0:.2f} s; manifest steady rate (EOS incl.) "
          f"{(build['steady_tps_manifest'] or 0) / 1e6:.3f} M tok/s")
    print(f"  ceiling tokens vs build text tokens: "
          f"{'equal' if ceiling['tokens'] == build['text_tokens'] else 'DIFFER'}")
    print(f"  peak RSS of the build's process tree: {rss:.3f} GiB "
          f"({build['rss_samples']} samples); output {build['out_bytes'] / 1e6:.1f} MB")
    rows.append((f"{title}: peak tree RSS <= {TARGET_RSS_GIB} GiB", f"{rss:.3f} GiB",
                 verdict(rss <= TARGET_RSS_GIB)))
    return rows


def print_targets(rows: list[tuple]):
    print("\n== targets")
    width = max(len(r[0]) for r in rows)
    for name, value, v in rows:
        print(f"  {name:<{width}}  {value:>12}  {v}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, help="working directory (default: a new temp dir)")
    p.add_argument("--tokens", type=float, default=60e6, help="GPT-2 corpus size, approx.")
    p.add_argument("--workers", type=int, default=2, help="threads for ceiling and build")
    p.add_argument("--hf", action=argparse.BooleanOptionalAction,
                   default=importlib.util.find_spec("tokenizers") is not None,
                   help="also compare the Hugging Face tokenizer (default: if installed)")
    p.add_argument("--hf-tokens", type=float, default=15e6, help="HF corpus size, approx.")
    p.add_argument("--memmap", action="store_true", help="also time --format memmap")
    p.add_argument("--keep", action="store_true", help="keep corpora and build outputs")
    return p.parse_args()


def main():
    args = parse_args()
    # The build subprocesses get the environment we started with, not the RAYON_NUM_THREADS
    # the HF ceiling sets for this process: the build is measured as a user would run it.
    build_env = dict(os.environ)
    made_work = args.work is None
    work = Path(tempfile.mkdtemp(prefix="bench_pack.")) if made_work else args.work
    work.mkdir(parents=True, exist_ok=True)
    print(f"bench_pack: work {work}, --tokens {args.tokens:.3g}, --workers {args.workers}, "
          f"hf {args.hf}, cpus {os.cpu_count()}, python {sys.version.split()[0]}", flush=True)
    targets = []
    try:
        t0 = time.perf_counter()
        corpus = write_corpus(work / "corpus", args.tokens)
        print(f"corpus: {corpus['files']} parquet files, {corpus['documents']:,} documents, "
              f"{corpus['chars'] / 1e6:.1f} M chars, {corpus['disk_bytes'] / 1e6:.1f} MB on disk"
              f" ({time.perf_counter() - t0:.1f} s)", flush=True)
        ceiling = ceiling_tiktoken(corpus["dir"], args.workers)
        print(f"ceiling tiktoken: {ceiling['tps'] / 1e6:.3f} M tok/s", flush=True)
        build = run_build(corpus["dir"], GPT2_TIKTOKEN, work / "out-mds", args.workers, build_env)
        print(f"pack build (mds): rc {build['rc']}, {build['wall']:.1f} s", flush=True)
        targets += report_pair("gpt2 tiktoken, mds", ceiling, build, check_steady=True)
        if args.memmap:
            mm = run_build(corpus["dir"], GPT2_TIKTOKEN, work / "out-memmap", args.workers,
                           build_env, ("--format", "memmap"))
            targets += report_pair("gpt2 tiktoken, memmap", ceiling, mm, check_steady=True)
        if args.hf:
            t0 = time.perf_counter()
            hf_corpus = write_corpus(work / "corpus-hf", args.hf_tokens)
            print(f"\nhf corpus: {hf_corpus['files']} files, {hf_corpus['documents']:,} documents,"
                  f" {hf_corpus['chars'] / 1e6:.1f} M chars ({time.perf_counter() - t0:.1f} s)",
                  flush=True)
            hf_ceiling = ceiling_hf(hf_corpus["dir"], args.workers)
            print(f"ceiling hf: {hf_ceiling['tps'] / 1e6:.3f} M tok/s", flush=True)
            hf_build = run_build(hf_corpus["dir"], NEOX_JSON, work / "out-hf", args.workers,
                                 build_env)
            print(f"pack build (hf): rc {hf_build['rc']}, {hf_build['wall']:.1f} s", flush=True)
            targets += report_pair("gpt-neox HF tokenizers, mds", hf_ceiling, hf_build,
                                   check_steady=False)
        print_targets(targets)
    finally:
        if args.keep:
            print(f"\nkept {work}")
        elif made_work:
            shutil.rmtree(work, ignore_errors=True)
        else:
            for name in ("corpus", "corpus-hf", "out-mds", "out-memmap", "out-hf"):
                shutil.rmtree(work / name, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
