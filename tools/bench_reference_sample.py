#!/usr/bin/env python
"""How many documents the fast engine's reference sample needs to catch a wrong engine, and what
the sample costs (issue 33): the figures SAMPLE_EVERY in pipeline/tokenize/engines.py is chosen from.

A build with the fast engine re-encodes the documents whose hash % SAMPLE_EVERY[library] == 0 with the
reference library and stops at the first difference. This script injects divergences the way a
real one would look -- "wrong engines" built from the correct tokenizer with one plausible bug:

  priority   two merges' ranks swapped (ids kept): BPE merges in another order;
  drop       one merge removed (its token can no longer be formed);
  id-swap    two token ids exchanged in the output;
  pattern    the pre-tokenization regex changed slightly (contractions, number grouping, the
             whitespace lookahead, a Unicode class);
  special    a literal special-token string in the text encoded as the special token;
  text       the text changed before encoding (NFC, CRLF -> LF, split into 16 KiB chunks);
  hf-*       the same kinds for the Hugging Face gpt-neox tokenizer.json (merges, normalizer,
             pre-tokenizer, added tokens).

The merges are chosen at random (--seed) among mid-frequency ones (ranks 1,000 to vocab / 2).
For each wrong engine, over the real documents of the shared FineWeb-Edu and Dolma samples in
build order (files sorted by path, records in file order), it measures the fraction p of
documents whose ids differ from the correct engine's and the first one that does; and, for a
sample of 1 in N documents, the probability of catching the divergence within the first D
documents: 1 - (1 - 1/N)^k_D, k_D the differing documents among the first D (a document is
sampled with probability 1/N independently of its content: the hash is XXH3), and where the real
hash (as encode.py takes it) first catches it. It also says whether the load-time check
(engines.check_agreement on HARD_TEXTS) already refuses the engine.

The cost: the CPU of the sample check itself (encode.py's pick and engines.first_mismatch, the
reference re-encoding the picked documents) over the FineWeb-Edu sample for each N, against the
CPU of `pack build` on --copies copies of that sample (--workers 2, the fast engine; minus a
one-document build's CPU for start-up and finish, to give the share of a long build): expected
(the reference on every document / N) and as the real hash picks on this sample.

    .venv/bin/python tools/bench_reference_sample.py [--no-hf] [--no-cost | --no-detection]
        [--seed 0] [--builds 2] [--copies 4] [--json OUT.json]
"""

import argparse
import glob
import gzip
import io
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "2")  # tokenizers' pool, read once at its start

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from bench_common import SHARED, CpuWatch, describe_checkout, pack_executable  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from longpack.pipeline.tokenize.engines import HARD_TEXTS, concat_ids, first_mismatch  # noqa: E402
from longpack.pipeline.tokenize.split import doc_hash  # noqa: E402
from longpack.pipeline.tokenize.tokenizer import load_tokenizer  # noqa: E402

FINEWEB = SHARED / "data" / "fineweb-edu-sample"
DOLMA = SHARED / "data" / "dolma-sample"
TOKENIZERS = SHARED / "tokenizers"
SAMPLE_EVERY = (64, 128, 256, 512, 1024, 2048)  # the N compared (powers of two, as engines.py's)
WITHIN = 2000  # "the first few thousand documents"
THREADS = 2


# ------------------------------------------------------------------------------------ documents

def read_fineweb() -> list[str]:
    texts = []
    for path in sorted(glob.glob(str(FINEWEB / "*.parquet"))):
        texts += pq.read_table(path, columns=["text"]).column("text").to_pylist()
    return texts


def read_dolma() -> list[str]:
    texts = []
    for path in sorted(DOLMA.iterdir(), key=str):
        if path.name.endswith(".gz"):
            f = gzip.open(path, "rt", encoding="utf-8")
        elif path.name.endswith(".zst"):
            import zstandard
            raw = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
            f = io.TextIOWrapper(raw, encoding="utf-8")
        else:
            continue
        with f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    return texts


def hashable(texts: list[str]) -> tuple[list[str], np.ndarray]:
    """The documents a build encodes (lone surrogates are skipped before) and their hashes."""
    kept, hashes = [], []
    for t in texts:
        try:
            hashes.append(doc_hash(t))
        except UnicodeEncodeError:
            continue
        kept.append(t)
    return kept, np.array(hashes, np.uint64)


# ------------------------------------------------------------------------------ wrong engines

class Wrong:
    """A wrong engine: `ids(texts, correct)` gives each text's ids (lists), `correct` being the
    right engine's ids, so a variant that cannot change a text returns its correct ids."""

    def __init__(self, name: str, what: str, ids, flat=None):
        self.name, self.what, self._ids, self._flat = name, what, ids, flat

    def ids(self, texts, correct):
        return self._ids(texts, correct)

    def encode_flat(self, texts):
        """For the load-time check (engines.first_mismatch against the reference)."""
        if self._flat is not None:
            return self._flat(texts)
        return concat_ids([np.asarray(i, np.uint32) for i in self._ids(texts, None)])


def only_where(texts, correct, changed, encode):
    """Re-encode only the texts `changed(text)` says the bug can touch; the rest keep the correct
    ids (an exact shortcut: the wrong engine is the correct one on those texts)."""
    if correct is None:
        return encode(texts)
    picks = [i for i, t in enumerate(texts) if changed(t)]
    out = list(correct)
    for i, ids in zip(picks, encode([texts[i] for i in picks])):
        out[i] = ids
    return out


def tiktoken_variants(name: str, rng: random.Random) -> tuple[object, list[Wrong]]:
    import tiktoken

    tok = load_tokenizer(str(TOKENIZERS / f"{name}.tiktoken"), engine="reference")
    enc = tok.reference.impl
    ranks, pat, specials = enc._mergeable_ranks, enc._pat_str, enc._special_tokens
    by_rank = {r: b for b, r in ranks.items()}
    lo, hi = 1000, len(ranks) // 2

    def encoding(pat_str=pat, mergeable=ranks, special=specials):
        return tiktoken.Encoding(name=f"{name}-wrong", pat_str=pat_str, mergeable_ranks=mergeable,
                                 special_tokens=special)

    def batch(e, remap=None):
        def encode(texts):
            out = e.encode_ordinary_batch(texts, num_threads=THREADS)
            if remap:
                out = [[remap.get(i, i) for i in ids] for ids in out]
            return out
        return encode

    def contains(*tokens):
        def changed(t):
            b = t.encode()
            return any(x in b for x in tokens)
        return changed

    def reencode(e, changed=None, remap=None):
        """The wrong engine `e` (ids mapped by `remap`) on the texts `changed` says it can touch."""
        if changed is None:
            return lambda texts, correct: batch(e, remap)(texts)
        return lambda texts, correct: only_where(texts, correct, changed, batch(e, remap))

    variants = []
    # Merge priority: two ranks swapped, the ids mapped back (only the merge order differs).
    for gap in (1, 1, 1000):
        r = rng.randrange(lo, hi)
        a, b = by_rank[r], by_rank[r + gap]
        swapped = {**ranks, a: r + gap, b: r}
        variants.append(Wrong(
            f"priority {r}<->{r + gap}", f"merges {a!r} and {b!r} in each other's order",
            reencode(encoding(mergeable=swapped), contains(a, b), {r: r + gap, r + gap: r})))
    for _ in range(2):
        r = rng.randrange(lo, hi)
        a = by_rank[r]
        dropped = {k: v for k, v in ranks.items() if v != r}
        variants.append(Wrong(
            f"drop {r}", f"merge to {a!r} lost",
            reencode(encoding(mergeable=dropped), contains(a))))
    r = rng.randrange(lo, hi)
    s = rng.randrange(lo, hi)
    a, b = by_rank[r], by_rank[s]
    variants.append(Wrong(
        f"id-swap {r}<->{s}", f"ids of {a!r} and {b!r} exchanged",
        lambda texts, correct, r=r, s=s: [
            [s if i == r else r if i == s else i for i in ids]
            for ids in (correct if correct is not None else batch(enc)(texts))]))

    # The pre-tokenization pattern, changed the way a port of it could get it wrong.
    if name == "gpt2":
        edits = [
            ("contractions (?i)", "'(?:[sdmt]|ll|ve|re)", "'(?i:[sdmt]|ll|ve|re)"),
            ("no contractions", "'(?:[sdmt]|ll|ve|re)|", ""),
            ("numbers in 3s", r" ?\p{N}++", r" ?\p{N}{1,3}+"),
            ("numbers no space", r" ?\p{N}++", r"\p{N}++"),
            (r"\p{N} as \p{Nd}", r"\p{N}", r"\p{Nd}"),
            (r"\p{L} as Lu|Ll", r"\p{L}", r"[\p{Lu}\p{Ll}]"),
            (r"no \s+(?!\S)", r"|\s+(?!\S)", ""),
            (r"no \s++$", r"|\s++$", ""),
        ]
    else:
        edits = [
            ("contractions case", "'(?i:[sdmt]|ll|ve|re)", "'(?:[sdmt]|ll|ve|re)"),
            ("numbers in 4s", r"\p{N}{1,3}+", r"\p{N}{1,4}+"),
            ("numbers ungrouped", r"\p{N}{1,3}+", r"\p{N}++"),
            (r"\p{N} as \p{Nd}", r"\p{N}", r"\p{Nd}"),
            (r"\p{L} as Lu|Ll", r"\p{L}", r"[\p{Lu}\p{Ll}]"),
            (r"no \s+(?!\S)", r"|\s+(?!\S)", ""),
            (r"no [\r\n]*+", r"[\r\n]*+", ""),
            ("letter prefix: space", r"[^\r\n\p{L}\p{N}]?+\p{L}++", r" ?\p{L}++"),
        ]
    for label, old, new in edits:
        assert old in pat, (name, old)
        variants.append(Wrong(f"pattern: {label}", f"{old!r} -> {new!r}",
                              reencode(encoding(pat_str=pat.replace(old, new)))))

    # Special tokens: a literal special-token string in the text taken as the special token.
    variants.append(Wrong(
        "special: literal -> id", "encode(allowed_special='all')",
        lambda texts, correct: only_where(
            texts, correct, lambda t: any(s in t for s in specials),
            lambda ts: enc.encode_batch(ts, allowed_special="all", num_threads=THREADS))))

    # The text changed before encoding.
    def text_variant(label, what, transform):
        variants.append(Wrong(label, what, lambda texts, correct: only_where(
            texts, correct, lambda t: transform(t) != t,
            lambda ts: batch(enc)([transform(t) for t in ts]))))

    text_variant("text: NFC", "unicodedata.normalize('NFC')",
                 lambda t: unicodedata.normalize("NFC", t))
    text_variant("text: CRLF->LF", "'\\r\\n' -> '\\n'", lambda t: t.replace("\r\n", "\n"))
    variants.append(Wrong(
        "text: 16 KiB chunks", "texts over 16,384 chars encoded in independent chunks",
        lambda texts, correct: only_where(texts, correct, lambda t: len(t) > 16384, lambda ts: [
            sum(batch(enc)([t[i:i + 16384] for i in range(0, len(t), 16384)]), []) for t in ts])))
    return tok, variants


BYTE_LEVEL = None


def byte_level_bytes(token: str) -> bytes:
    """A ByteLevel token string (GPT-2's bytes_to_unicode alphabet) as the bytes it stands for."""
    global BYTE_LEVEL
    if BYTE_LEVEL is None:
        bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        cs, n = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        BYTE_LEVEL = {chr(c): b for b, c in zip(bs, cs)}
    return bytes(BYTE_LEVEL[ch] for ch in token)


def hf_variants(rng: random.Random) -> tuple[object, list[Wrong]]:
    from tokenizers import Tokenizer as HFTokenizer

    path = TOKENIZERS / "gpt-neox-tokenizer.json"
    tok = load_tokenizer(str(path), engine="reference")
    spec = json.loads(path.read_text())
    merges = spec["model"]["merges"]

    def tokenizer(edit, split_special=True):
        j = json.loads(json.dumps(spec))
        edit(j)
        t = HFTokenizer.from_str(json.dumps(j))
        t.encode_special_tokens = split_special
        return t

    def batch(t):
        return lambda texts: [e.ids for e in t.encode_batch_fast(texts, add_special_tokens=False)]

    def merged(m):
        return byte_level_bytes(m.replace(" ", "") if isinstance(m, str) else "".join(m))

    def contains(*tokens):
        def changed(t):
            b = unicodedata.normalize("NFC", t).encode()
            return any(x in b for x in tokens)
        return changed

    def reencode(t, changed=None):
        if changed is None:
            return lambda texts, correct: batch(t)(texts)
        return lambda texts, correct: only_where(texts, correct, changed, batch(t))

    variants = []
    lo, hi = 1000, len(merges) // 2
    for _ in range(2):
        i = rng.randrange(lo, hi)

        def swap(j, i=i):
            m = j["model"]["merges"]
            m[i], m[i + 1] = m[i + 1], m[i]
        variants.append(Wrong(
            f"hf priority {i}<->{i + 1}", f"merges {merges[i]!r} and {merges[i + 1]!r} swapped",
            reencode(tokenizer(swap), contains(merged(merges[i]), merged(merges[i + 1])))))
    i = rng.randrange(lo, hi)

    def drop(j, i=i):
        del j["model"]["merges"][i]
    variants.append(Wrong(
        f"hf drop {i}", f"merge {merges[i]!r} lost",
        reencode(tokenizer(drop), contains(merged(merges[i])))))

    def no_nfc(j):
        j["normalizer"] = None

    def prefix_space(j):
        j["pre_tokenizer"]["add_prefix_space"] = True

    def no_added(j):
        j["added_tokens"] = [a for a in j["added_tokens"] if a["special"]]
    for label, what, edit in (
            ("hf no NFC", "normalizer dropped", no_nfc),
            ("hf add_prefix_space", "ByteLevel add_prefix_space: true", prefix_space),
            ("hf added tokens ignored", "the non-special added tokens (space runs) dropped",
             no_added)):
        variants.append(Wrong(label, what, reencode(tokenizer(edit))))
    variants.append(Wrong(
        "hf special: literal -> id", "encode_special_tokens = False",
        reencode(tokenizer(lambda j: None, split_special=False))))
    return tok, variants


# ---------------------------------------------------------------------------------- detection

def detection(differ: np.ndarray, hashes: np.ndarray) -> dict:
    """From the per-document 'ids differ' flags in build order: p, the first difference and,
    for each N, the chance the sample catches it within WITHIN documents and within the whole
    build, and the document at which the real hash catches it."""
    n, k = len(differ), int(differ.sum())
    out = {"docs": n, "differ": k, "p": k / n if n else 0.0,
           "first": int(np.argmax(differ)) + 1 if k else None, "by_n": {}}
    for every in SAMPLE_EVERY:
        miss = 1 - 1 / every
        caught = np.flatnonzero(differ & (hashes % np.uint64(every) == 0))
        out["by_n"][every] = {
            "within": 1 - miss ** int(differ[:WITHIN].sum()),
            "build": 1 - miss ** k,
            "hash_first": int(caught[0]) + 1 if len(caught) else None,
        }
    return out


def load_check_catches(wrong: Wrong, reference) -> bool:
    texts = list(HARD_TEXTS)
    try:
        ids, offsets = wrong.encode_flat(texts)
    except Exception:  # an engine that fails on the hard texts is refused as well
        return True
    return first_mismatch(reference, texts, ids, offsets, range(len(texts))) is not None


def measure_variants(label, tok, variants, corpora, encode_correct) -> list[dict]:
    rows = []
    correct = {}
    for cname, (texts, _) in corpora.items():
        t0 = time.perf_counter()
        correct[cname] = encode_correct(texts)
        print(f"  {label}: correct ids of {cname} ({len(texts)} docs) in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    for w in variants:
        t0 = time.perf_counter()
        row = {"tokenizer": label, "variant": w.name, "what": w.what,
               "load_check": load_check_catches(w, tok.reference)}
        for cname, (texts, hashes) in corpora.items():
            ids = w.ids(texts, correct[cname])
            differ = np.fromiter((a != b for a, b in zip(ids, correct[cname])), bool, len(texts))
            row[cname] = detection(differ, hashes)
        rows.append(row)
        print(f"  {label}: {w.name}: p = "
              + ", ".join(f"{c} {row[c]['p']:.4f}" for c in corpora)
              + f" ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return rows


# ---------------------------------------------------------------------------------------- cost

def sample_cpu(spec: str, texts: list[str], hashes: np.ndarray, repeat: int) -> dict:
    """CPU seconds (the process's: tokenizers' reference runs its own threads; nothing else runs
    meanwhile) of encode.py's sample check over `texts` in build-sized batches,
    for each N: the pick by hash and first_mismatch (the reference re-encoding the picks and
    the comparison); and the share of the texts' characters the picks hold."""
    tok = load_tokenizer(spec, engine="fast")
    batches = []
    for s in range(0, len(texts), 1024):  # pipeline/read/parquet.py's BATCH_ROWS
        part = texts[s:s + 1024]
        batches.append((part, [int(h) for h in hashes[s:s + 1024]], *tok.engine.encode_flat(part)))
    chars = sum(len(t) for t in texts)
    out = {}
    for every in SAMPLE_EVERY:
        best = None
        for _ in range(repeat):
            t0 = time.process_time()
            for part, hs, ids, offsets in batches:
                picks = [i for i, h in enumerate(hs) if h % every == 0]
                assert first_mismatch(tok.reference, part, ids, offsets, picks) is None
            cpu = time.process_time() - t0
            best = cpu if best is None else min(best, cpu)
        picked = sum(len(t) for t, h in zip(texts, hashes) if int(h) % every == 0)
        out[every] = {"cpu": best, "chars": picked / chars}
    t0 = time.process_time()
    tok.reference.encode_flat(texts)
    out["all"] = {"cpu": time.process_time() - t0, "chars": 1.0}
    return out


def build_cpu(spec: str, fmt: str, inputs: Path, repeat: int,
              limit_docs: int | None = None) -> dict:
    """Best (by CPU) of `repeat` runs of pack build on `inputs`, fast engine, 2 workers."""
    best = None
    with tempfile.TemporaryDirectory(prefix="bench_refsample.") as work:
        for _ in range(repeat):
            cmd = [pack_executable(), "build", "--dataset", "fineweb-edu", "--input", str(inputs),
                   "--tokenizer", spec, "--tokenizer-engine", "fast", "--workers", "2",
                   "--format", fmt, "--quiet", "--overwrite", "--out", str(Path(work) / "out")]
            if limit_docs:
                cmd += ["--limit-docs", str(limit_docs)]
            watch = CpuWatch()
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - t0
            cpu, others = watch.read()
            run = {"cpu": cpu, "wall": wall, "others": others}
            if best is None or cpu < best["cpu"]:
                best = run
    return best


def measure_cost(texts, hashes, copies: int, repeat: int, hf: bool) -> list[dict]:
    """The sample check's CPU at each N against the build's CPU, on `copies` copies of the
    FineWeb-Edu sample (a longer build: start-up weighs less; the copies' documents repeat, so
    the hash picks the same ones in each)."""
    from longpack.pipeline.tokenize.engines import SAMPLE_EVERY as CURRENT_BY_LIBRARY

    print(f"\nCPU of the sample check against pack build's: the FineWeb-Edu sample x {copies} "
          f"({copies * len(texts)} docs), --workers 2, fast engine, best of {repeat} by CPU")
    print(f"{'tokenizer':<10} {'format':<6} {'build':>6} {'fixed':>6} {'steady':>6} {'wall':>5} "
          f"{'others':>6} {'ref all':>7}   share of the steady build at N = "
          + " ".join(f"{e:>12}" for e in SAMPLE_EVERY))
    out = []
    with tempfile.TemporaryDirectory(prefix="bench_refsample_in.") as inputs:
        for c in range(copies):
            for path in sorted(FINEWEB.glob("*.parquet")):
                shutil.copyfile(path, Path(inputs) / f"copy{c}_{path.name}")
        for name, fmt in (("gpt2", "memmap"), ("gpt2", "mds"), ("cl100k_base", "memmap"),
                          ("gpt-neox", "memmap")):
            if name == "gpt-neox" and not hf:
                continue
            spec = str(TOKENIZERS / (f"{name}-tokenizer.json" if name == "gpt-neox"
                                     else f"{name}.tiktoken"))
            current = CURRENT_BY_LIBRARY["tokenizers" if name == "gpt-neox" else "tiktoken"]
            sample = sample_cpu(spec, texts, hashes, repeat)
            full = build_cpu(spec, fmt, Path(inputs), repeat)
            fixed = build_cpu(spec, fmt, Path(inputs), repeat, limit_docs=1)
            ref_all = copies * sample["all"]["cpu"]
            # The build ran the check at encode.py's N (its realized CPU): take it out.
            steady = full["cpu"] - fixed["cpu"] - copies * sample[current]["cpu"]
            shares = {e: {"expected": (ref_all / e) / (steady + ref_all / e),
                          "realized": copies * sample[e]["cpu"]
                          / (steady + copies * sample[e]["cpu"])} for e in SAMPLE_EVERY}
            cells = " ".join(f"{100 * v['expected']:5.1f} ({100 * v['realized']:4.1f})"
                             for v in shares.values())
            print(f"{name[:10]:<10} {fmt:<6} {full['cpu']:>6.2f} {fixed['cpu']:>6.2f} "
                  f"{steady:>6.2f} {full['wall']:>5.2f} {full['others']:>6.2f} {ref_all:>7.2f}"
                  f"   {' ' * 33}{cells}")
            out.append({"tokenizer": name, "format": fmt, "copies": copies, "build": full,
                        "fixed": fixed, "steady_cpu": steady, "reference_all_cpu": ref_all,
                        "sample": sample, "shares": shares, "current": current})
    print("CPU seconds. build: pack build's process CPU; fixed: a one-document build's (start-up "
          "and finish); steady: build - fixed - the check it ran (at engines.py's N: "
          f"{CURRENT_BY_LIBRARY}); ref all: the reference library on every document (one thread for "
          "tiktoken). Share at N: expected, (ref all / N) / (steady + ref all / N), the hash "
          "picking 1/N of the text; in brackets, as the real hash picks on this sample "
          "(encode.py's pick and first_mismatch, timed).")
    print("share of the text the real hash picks: " + ", ".join(
        f"N={e} {100 * out[0]['sample'][e]['chars']:.2f}% (1/N = {100 / e:.2f}%)"
        for e in SAMPLE_EVERY))
    return out


# --------------------------------------------------------------------------------------- report

def pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.995 or x < 0.005 or x >= 0.1 else f"{100 * x:.1f}%"


def docs_to(prob: float, p: float, every: int) -> float:
    """Documents until the sample has caught a divergence of rate p with probability `prob`."""
    return math.log(1 - prob) / (p * math.log(1 - 1 / every)) if p else math.inf


def print_detection(rows: list[dict], shown=(64, 128, 256, 512)) -> None:
    fw, do = rows[0]["fineweb-edu"]["docs"], rows[0]["dolma"]["docs"]
    head = " ".join(f"{e:>5}" for e in shown)
    print(f"\nWrong engines against the correct one: the FineWeb-Edu sample ({fw} docs) and the "
          f"Dolma sample ({do} docs), each in build order.\n"
          "load: the load-time check (HARD_TEXTS) refuses it; p: the fraction of documents whose "
          "ids differ; first: the first such document (FineWeb-Edu); P(2000): the chance a "
          "1-in-N sample has caught it within the first 2,000 FineWeb-Edu documents, "
          "1 - (1 - 1/N)^k, k the differing ones among them; 90% at: the documents until that "
          "chance is 90% at rate p, ln 0.1 / (p ln(1 - 1/N)); hash: the FineWeb-Edu document at "
          "which encode.py's own pick (h % N == 0) first meets a differing one ('-': not within "
          "the sample)")
    print(f"{'tokenizer':<8} {'wrong engine':<27} {'load':>4} {'p fw':>6} {'p dolma':>7} "
          f"{'first':>5} | P({WITHIN}) at N = {head} | 90% at N = {head} | hash at N = {head}")
    for r in rows:
        d, dd = r["fineweb-edu"], r["dolma"]
        within = " ".join(f"{pct(d['by_n'][e]['within']):>5}" for e in shown)
        p = (d["p"] * d["docs"] + dd["p"] * dd["docs"]) / (d["docs"] + dd["docs"])
        to90 = " ".join(f"{fmt_docs(docs_to(0.9, p, e)):>5}" for e in shown)
        first = " ".join(f"{d['by_n'][e]['hash_first'] or '-':>5}" for e in shown)
        print(f"{r['tokenizer'][:8]:<8} {r['variant'][:27]:<27} "
              f"{'yes' if r['load_check'] else 'no':>4} {d['p']:>6.4f} {dd['p']:>7.4f} "
              f"{d['first'] or '-':>5} | {' ' * 13}{within} | {' ' * 11}{to90} | "
              f"{' ' * 12}{first}")
    print("(90% at: p over both samples; k = thousands, M = millions)")


def fmt_docs(n: float) -> str:
    if n == math.inf:
        return "never"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M" if n >= 1e7 else f"{n / 1e6:.1f}M"
    if n >= 1e4:
        return f"{n / 1e3:.0f}k"
    if n >= 1e3:
        return f"{n / 1e3:.1f}k"
    return f"{n:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="picks the merges changed")
    ap.add_argument("--no-hf", action="store_true", help="skip the gpt-neox tokenizer.json")
    ap.add_argument("--no-cost", action="store_true", help="skip the CPU measurement")
    ap.add_argument("--no-detection", action="store_true", help="only the CPU measurement")
    ap.add_argument("--builds", type=int, default=2, help="pack build runs per measurement")
    ap.add_argument("--copies", type=int, default=4,
                    help="copies of the FineWeb-Edu sample built for the CPU figures")
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()

    print(f"checkout {describe_checkout()}, {os.cpu_count()} CPUs", file=sys.stderr)
    corpora = {"fineweb-edu": hashable(read_fineweb()), "dolma": hashable(read_dolma())}
    rng = random.Random(args.seed)
    rows = []
    for name in () if args.no_detection else ("gpt2", "cl100k_base"):
        tok, variants = tiktoken_variants(name, rng)
        enc = tok.reference.impl
        rows += measure_variants(name, tok, variants, corpora,
                                 lambda texts, enc=enc: enc.encode_ordinary_batch(
                                     texts, num_threads=THREADS))
    if not args.no_hf and not args.no_detection:
        tok, variants = hf_variants(rng)
        impl = tok.reference.impl
        rows += measure_variants("gpt-neox", tok, variants, corpora, lambda texts: [
            e.ids for e in impl.encode_batch_fast(texts, add_special_tokens=False)])
    if rows:
        print_detection(rows)
    result = {"checkout": describe_checkout(), "seed": args.seed, "rows": rows}

    if not args.no_cost:
        texts, hashes = corpora["fineweb-edu"]
        result["cost"] = measure_cost(texts, hashes, args.copies, args.builds, not args.no_hf)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
