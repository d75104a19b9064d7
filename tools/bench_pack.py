#!/usr/bin/env python
"""Benchmark `pack build` throughput against the tokenizer's own ceiling on the same cores.

What it measures, in one run:

1. Corpus. It writes a real-text corpus of about --tokens GPT-2 tokens (default 60 M, ~200 MB of
   text) as parquet files in the FineWeb-Edu schema (zstd, row groups of 1000 rows, ~32 MB of
   text per file). The texts are the real documents in /work/shared/data/fineweb-edu-sample and
   /work/shared/data/dolma-sample, cycled (each pass in its own shuffled order) until the
   character budget, estimated at TOKENS_PER_CHAR tokens per character, is reached. The true
   token count is the one the build reports in its manifest.
2. Ceilings. All texts are loaded into memory (not timed), then each tokenizer alone is timed
   on them with W threads: the reference, `enc.encode_ordinary_batch(texts, num_threads=W)` of
   the GPT-2 tiktoken encoding loaded offline (ids converted to Python lists, as it returns
   them), and the fast engine, fastokens' `encode_batch_flat` over W threads (one flat array:
   pack build's fast path). These are the fastest each tokenizer alone turns the texts into ids.
   Each ceiling runs in a fresh interpreter of its own (`--ceiling NAME`, internal), so no other
   tokenizer library's threads or the previous ceiling's objects share its process.
3. Builds. `pack build --dataset fineweb-edu --input CORPUS --tokenizer gpt2.tiktoken --seq
   32768 --workers W --quiet --tokenizer-engine fast` (and `reference`) run as subprocesses;
   the wall clock (start-up included) is timed and the RSS of the whole process tree sampled
   every ~50 ms for the peak. The manifest gives the tokens packed (`counts.tokens`, one EOS
   per document included: text tokens are counts.tokens - counts.documents, and those are
   compared with the ceilings) and the steady-state time of the main loop
   (`timings.steady_seconds`, start-up excluded).
4. Optionally (--hf, on by default when `tokenizers` is installed) the gpt-neox
   tokenizer.json on a corpus of its own (--hf-tokens, by default as large as the GPT-2 one, so
   that the fixed start-up weighs the same in both): ceiling = Hugging Face tokenizers'
   `encode_batch_fast(texts, add_special_tokens=False)` with RAYON_NUM_THREADS=W; builds with
   both engines.

Ceilings and builds alternate --repeat times (default 3) and the best run of each is reported
(peak RSS: the worst), because on a small shared machine other processes take CPU now and then.
Each row also shows the CPU seconds the run used and how many cores' worth of CPU other processes
used meanwhile ("others", from /proc/stat): a row with others well above 0 was disturbed.

Targets (issues 13 and 33): the fast engine's build end to end >= 3.0 x the tiktoken ceiling
and >= 0.75 (MDS) / 0.8 (memmap) x its own engine's ceiling (gpt2); the reference engine's build
>= 0.85 x the tiktoken ceiling (what it reached before the engines), steady state >= 0.9;
gpt-neox with the fast engine >= 10 x the tokenizers ceiling; peak tree RSS <= 1.5 GiB. It
prints a table with PASS/FAIL per target and exits 0 whatever the figures are: it is a
measuring tool, not a test.

    .venv/bin/python tools/bench_pack.py [--work DIR] [--tokens 60e6] [--workers 2] [--repeat 3]
                                         [--no-hf] [--hf-tokens 60e6] [--memmap] [--keep]
                                         [--tasks N]   (instead: tools/bench_tasks.py)
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
import threading
import time
from pathlib import Path

import bench_tasks  # noqa: E402
import pyarrow as pa
import pyarrow.parquet as pq
from bench_common import (  # noqa: E402
    SHARED,
    CpuWatch,
    clean_work,
    describe_checkout,
    pack_executable,
    verdict,
    work_dir,
)  # noqa: E402

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

TARGET_E2E = 0.85  # of the ceiling of the build's own engine
TARGET_STEADY = 0.90
TARGET_FAST_VS_FASTOKENS = {"mds": 0.75, "memmap": 0.8}  # issue 33: the fast build, own ceiling
TARGET_FAST_VS_TIKTOKEN = 3.0  # the fast engine's build against the tiktoken ceiling (issue 33)
TARGET_FAST_VS_TOKENIZERS = 10.0  # the same for the Hugging Face tokenizer.json
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


def time_ceiling(encode, corpus: Path) -> dict:
    """Time encode(texts) over all texts of the corpus, loaded beforehand (not timed)."""
    texts = load_texts(corpus)
    watch = CpuWatch()
    t0 = time.perf_counter()
    results = encode(texts)
    seconds = time.perf_counter() - t0
    cpu, others = watch.read()
    tokens = sum(len(r) for r in results)  # lists of ids (reference) or flat arrays (fast)
    del results, texts  # gigabytes of Python objects: gone before the build runs beside us
    gc.collect()
    return {"tokens": tokens, "seconds": seconds, "tps": tokens / seconds, "cpu": cpu,
            "others": others}


def tiktoken_encoder(workers: int):
    enc = gpt2_encoding()
    return lambda texts: enc.encode_ordinary_batch(texts, num_threads=workers)


def sample_check_encoder(workers: int):
    """What the fast engine's build adds to check itself: the reference re-encodes the sampled
    documents (doc_hash % SAMPLE_EVERY["tiktoken"] == 0), as tokenize/encode.py does, on the same
    threads."""
    from longpack.pipeline.tokenize.engines import SAMPLE_EVERY
    from longpack.pipeline.tokenize.split import doc_hash

    encode = tiktoken_encoder(workers)
    return lambda texts: encode([t for t in texts if doc_hash(t) % SAMPLE_EVERY["tiktoken"] == 0])


def fast_encoder(tokenizer: Path, workers: int):
    """fastokens over `workers` threads (it releases the GIL), as pack build's workers call it:
    a batch of texts each, one flat array of ids back."""
    from concurrent.futures import ThreadPoolExecutor

    from longpack.pipeline.tokenize.tokenizer import load_tokenizer

    engine = load_tokenizer(str(tokenizer), engine="fast").engine
    pool = ThreadPoolExecutor(workers)

    def encode(texts):
        batches = [texts[i:i + 2048] for i in range(0, len(texts), 2048)]
        return [ids for ids, _ in pool.map(engine.encode_flat, batches)]

    return encode


def hf_encoder(workers: int):
    # Rayon reads its thread count once, when the tokenizers library starts its pool.
    os.environ["RAYON_NUM_THREADS"] = str(workers)
    import tokenizers
    tok = tokenizers.Tokenizer.from_file(str(NEOX_JSON))
    return lambda texts: tok.encode_batch_fast(texts, add_special_tokens=False)


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


def run_build(corpus: Path, tokenizer: Path, out: Path, workers: int, env: dict,
              extra: tuple = ()) -> dict:
    cmd = [pack_executable(), "build", "--dataset", "fineweb-edu", "--input", str(corpus),
           "--tokenizer", str(tokenizer), "--seq", str(SEQ), "--out", str(out),
           "--workers", str(workers), "--quiet", *extra]
    if out.exists():
        shutil.rmtree(out)
    watch = CpuWatch()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sampler = TreeRssSampler(proc.pid)
    sampler.start()
    output = proc.communicate()[0].decode("utf-8", "replace")
    wall = time.perf_counter() - t0
    sampler.stop()
    cpu, others = watch.read()  # cpu: the build's tree (and our RSS sampler, a few %)
    result = {"cmd": cmd, "rc": proc.returncode, "wall": wall, "peak_rss": sampler.peak,
              "cpu": cpu, "others": others,
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

ENCODERS = {  # ceiling name -> encoder factory(workers); each is timed in a process of its own
    "tiktoken": tiktoken_encoder,
    "sample-check": sample_check_encoder,
    "fastokens": lambda workers: fast_encoder(GPT2_TIKTOKEN, workers),
    "tokenizers": hf_encoder,
    "fastokens-neox": lambda workers: fast_encoder(NEOX_JSON, workers),
}


def ceiling_in_subprocess(name: str, corpus: Path, workers: int, env: dict) -> dict:
    """time_ceiling of one encoder in a fresh interpreter: no other tokenizer library loaded
    beside it (two Rust libraries' thread pools in one process disturbed each other's figures)
    and none of the previous ceiling's gigabytes of Python objects still around."""
    cmd = [sys.executable, __file__, "--ceiling", name, "--corpus", str(corpus),
           "--workers", str(workers)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(corpus: Path, encoders: list[str], variants: list[tuple], workers: int, env: dict,
            repeat: int, work: Path) -> tuple[dict, dict]:
    """`repeat` rounds of: each ceiling (name -> encode), then one build per variant (label,
    tokenizer, extra flags).

    Ceilings and builds alternate so that load from other processes on the shared cores falls
    on all alike; the report takes the best run of each (the least disturbed one).
    """
    ceilings = {name: [] for name in encoders}
    builds = {label: [] for label, _, _ in variants}
    for i in range(repeat):
        for name in encoders:
            c = ceiling_in_subprocess(name, corpus, workers, env)
            ceilings[name].append(c)
            print(f"  run {i + 1}/{repeat}: ceiling {name} {c['tps'] / 1e6:.3f} M tok/s "
                  f"(others {c['others']:.2f} cores)", flush=True)
        for label, tokenizer, extra in variants:
            b = run_build(corpus, tokenizer, work / f"out-{label}", workers, env, extra)
            builds[label].append(b)
            rate = f"{b['e2e_tps'] / 1e6:.3f} M tok/s" if "e2e_tps" in b else "no manifest"
            print(f"  run {i + 1}/{repeat}: pack build {label}: rc {b['rc']}, "
                  f"{b['wall']:.1f} s, {rate} (others {b['others']:.2f} cores)", flush=True)
            if b["rc"] != 0:
                return ceilings, builds  # a failing build fails again: report it now
    return ceilings, builds


def table_row(name: str, run: dict, tokens: int, seconds: float, tps: float, base: float,
              all_tps: list[float]) -> str:
    spread = " ".join(f"{x / 1e6:.2f}" for x in all_tps)
    return (f"  {name:34}{tokens:>13,}{seconds:>9.2f}{tps / 1e6:>9.3f}{tps / base:>8.3f}"
            f"{run['cpu']:>8.1f}{run['others']:>8.2f}  {spread}")


def report(title: str, ceilings: dict, builds: list, judged: list[tuple[str, float]],
           check_steady: bool) -> list[tuple]:
    """Print one build variant's table against every ceiling (ratios to the first); return its
    (target, value, verdict) rows: end to end >= target x each ceiling named in `judged`."""
    best = {name: max(runs, key=lambda c: c["tps"]) for name, runs in ceilings.items()}
    first = next(iter(best))
    print(f"\n== {title} (best of {len(builds)} runs each; x = ratio to the {first} ceiling)")
    print(f"  {'':34}{'tokens':>13}{'seconds':>9}{'M tok/s':>9}{'x':>8}"
          f"{'cpu s':>8}{'others':>8}  M tok/s of every run")
    base = best[first]["tps"]
    for name, c in best.items():
        print(table_row(f"ceiling: {name} alone", c, c["tokens"], c["seconds"], c["tps"], base,
                        [r["tps"] for r in ceilings[name]]))
    failed = [b for b in builds if b["rc"] != 0 or "tokens" not in b]
    if failed:
        b = failed[0]
        print(f"  pack build FAILED (rc {b['rc']}) after {b['wall']:.1f} s:\n"
              f"    {' '.join(b['cmd'])}\n" + b["output"][-4000:])
        return [(f"{title}: build runs", f"rc {b['rc']}", "FAIL")]
    e2e = max(builds, key=lambda b: b["e2e_tps"])
    print(table_row("pack build end to end (wall)", e2e, e2e["text_tokens"], e2e["wall"],
                    e2e["e2e_tps"], base, [b["e2e_tps"] for b in builds]))
    rows = []
    for name, target in judged:
        ratio = e2e["e2e_tps"] / best[name]["tps"]
        rows.append((f"{title}: end to end >= {target} x {name} ceiling", f"{ratio:.3f}",
                     verdict(ratio >= target)))
    steadies = [b for b in builds if b["steady_tps"]]
    if steadies:
        st = max(steadies, key=lambda b: b["steady_tps"])
        print(table_row("pack build steady state", st, st["text_tokens"], st["steady_seconds"],
                        st["steady_tps"], base, [b["steady_tps"] for b in steadies]))
        if check_steady:
            name = judged[0][0]
            ratio = st["steady_tps"] / best[name]["tps"]
            rows.append((f"{title}: steady state >= {TARGET_STEADY} x {name} ceiling",
                         f"{ratio:.3f}", verdict(ratio >= TARGET_STEADY)))
    rss = max(b["peak_rss"] for b in builds) / GIB
    print(f"  text tokens = counts.tokens {e2e['tokens']:,} - counts.documents "
          f"{e2e['documents']:,} (one EOS each); skipped {e2e['skipped'] or 0}")
    print(f"  ceiling tokens {'equal' if best[first]['tokens'] == e2e['text_tokens'] else 'DIFFER from'}"
          f" build text tokens; start-up {e2e['startup_seconds'] or 0:.2f} s; manifest "
          f"steady rate (EOS incl.) {(e2e['steady_tps_manifest'] or 0) / 1e6:.3f} M tok/s")
    print(f"  peak RSS of the build's process tree: {rss:.3f} GiB (worst run; every run: "
          + " ".join(f"{b['peak_rss'] / GIB:.3f}" for b in builds)
          + f"); output {e2e['out_bytes'] / 1e6:.1f} MB")
    rows.append((f"{title}: peak tree RSS <= {TARGET_RSS_GIB} GiB", f"{rss:.3f} GiB",
                 verdict(rss <= TARGET_RSS_GIB)))
    return rows


def print_targets(rows: list[tuple]):
    print("\n== targets")
    if not rows:
        print("  none measured (a build failed: see above)")
        return
    width = max(len(r[0]) for r in rows)
    for name, value, v in rows:
        print(f"  {name:<{width}}  {value:>12}  {v}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work", type=Path, help="working directory (default: a new temp dir)")
    p.add_argument("--tokens", type=float, default=60e6, help="GPT-2 corpus size, approx.")
    p.add_argument("--workers", type=int, default=2, help="threads for ceiling and build")
    p.add_argument("--repeat", type=int, default=3,
                   help="rounds of ceiling + build(s); the best run of each is reported")
    p.add_argument("--hf", action=argparse.BooleanOptionalAction,
                   default=importlib.util.find_spec("tokenizers") is not None,
                   help="also compare the Hugging Face tokenizer (default: if installed)")
    p.add_argument("--hf-tokens", type=float, default=60e6, help="HF corpus size, approx.")
    p.add_argument("--memmap", action="store_true", help="also time --format memmap")
    p.add_argument("--keep", action="store_true", help="keep corpora and build outputs")
    p.add_argument("--tasks", type=int, help="instead: a build split into N tasks (Ray, and N "
                   "processes) against one process (tools/bench_tasks.py)")
    p.add_argument("--ceiling", choices=ENCODERS, help=argparse.SUPPRESS)  # internal: one ceiling
    p.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    return p.parse_args()


def make_corpus(out: Path, tokens: float) -> Path:
    t0 = time.perf_counter()
    c = write_corpus(out, tokens)
    print(f"{out.name}: {c['files']} parquet files, {c['documents']:,} documents, "
          f"{c['chars'] / 1e6:.1f} M chars, {c['disk_bytes'] / 1e6:.1f} MB on disk "
          f"({time.perf_counter() - t0:.1f} s to write)", flush=True)
    return c["dir"]


def main():
    args = parse_args()
    if args.ceiling:  # the child process of ceiling_in_subprocess
        c = time_ceiling(ENCODERS[args.ceiling](args.workers), args.corpus)
        print(json.dumps(c))
        return 0
    # The build subprocesses get the environment we started with, not the RAYON_NUM_THREADS
    # the HF ceiling sets for this process: the build is measured as a user would run it.
    build_env = dict(os.environ)
    work, made_work = work_dir(args.work, "bench_pack.")
    print(f"bench_pack: work {work}, --tokens {args.tokens:.3g}, --workers {args.workers}, "
          f"--repeat {args.repeat}, hf {args.hf}, cpus {os.cpu_count()}, "
          f"python {sys.version.split()[0]}, checkout {describe_checkout()}", flush=True)
    print("cpu s = CPU seconds the run used (whole run, for steady state too); others = cores'"
          " worth of CPU other processes used meanwhile", flush=True)
    targets = []
    try:
        corpus = make_corpus(work / "corpus", args.tokens)
        if args.tasks:
            print_targets(bench_tasks.run(corpus, GPT2_TIKTOKEN, work, args.tasks, args.workers,
                                          args.repeat, build_env, SEQ))
            return 0
        engine = ("--tokenizer-engine",)
        variants = [("mds-fast", GPT2_TIKTOKEN, (*engine, "fast")),
                    ("mds-reference", GPT2_TIKTOKEN, (*engine, "reference"))]
        if args.memmap:
            variants.append(("memmap-fast", GPT2_TIKTOKEN, ("--format", "memmap", *engine, "fast")))
        encoders = ["tiktoken", "fastokens", "sample-check"]
        ceilings, builds = measure(corpus, encoders, variants, args.workers, build_env,
                                   args.repeat, work)
        for label, _, _ in variants:
            if not builds[label]:
                continue
            fast = label.endswith("fast")
            judged = ([("fastokens", TARGET_FAST_VS_FASTOKENS[label.split("-")[0]]),
                       ("tiktoken", TARGET_FAST_VS_TIKTOKEN)] if fast
                      else [("tiktoken", TARGET_E2E)])
            ceilings_shown = {n: ceilings[n] for n in ("tiktoken", "fastokens")}
            targets += report(f"gpt2, {label}", ceilings_shown, builds[label], judged, not fast)
        check, fast = (min(ceilings[n], key=lambda c: c["seconds"])
                       for n in ("sample-check", "fastokens"))
        print(f"\n== the fast engine's sample check (reference re-encoding ~1/128 of the "
              f"documents): {check['seconds']:.2f} s, {check['seconds'] / fast['seconds']:.1%} "
              f"of the fastokens ceiling's time")
        if args.hf:
            print(flush=True)
            hf_corpus = make_corpus(work / "corpus-hf", args.hf_tokens)
            encoders = ["tokenizers", "fastokens-neox"]
            variants = [("hf-fast", NEOX_JSON, (*engine, "fast")),
                        ("hf-reference", NEOX_JSON, (*engine, "reference"))]
            ceilings, builds = measure(hf_corpus, encoders, variants, args.workers, build_env,
                                       args.repeat, work)
            targets += report("gpt-neox tokenizer.json, hf-fast", ceilings, builds["hf-fast"],
                              [("tokenizers", TARGET_FAST_VS_TOKENIZERS),
                               ("fastokens-neox", TARGET_E2E)], False)
            targets += report("gpt-neox tokenizer.json, hf-reference", ceilings,
                              builds["hf-reference"], [("tokenizers", TARGET_E2E)], False)
        print_targets(targets)
    finally:
        clean_work(work, made_work, args.keep, (
            "corpus", "corpus-hf", "out-mds-fast", "out-mds-reference", "out-memmap-fast",
            "out-hf-fast", "out-hf-reference", *bench_tasks.out_names(args.tasks or 0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
