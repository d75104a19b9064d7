"""Assemble `pack stats`: scan the splits, cross-check them and the manifest, recommend, render.

`collect` returns the report as a plain dict (the --json output, keys in docs/STATS.md);
`render` turns it into one screen of text. `decode_row` and `plot` serve --decode and --plot.
"""

import io
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from longpack.core import LongpackError, install_hint, is_url, write_bytes
from longpack.pipeline.builds.identity import copy_fix, copy_problem
from longpack.pipeline.formats.shards import ShardError, SplitReader
from longpack.pipeline.manifest import tokenizer_label
from longpack.pipeline.stats.digest import digest
from longpack.pipeline.stats.files import file_checks, open_output
from longpack.pipeline.stats.recommend import recommendations
from longpack.pipeline.stats.scan import FIX_REBUILD, VOCAB_SAMPLE, Problem, SplitScan
from longpack.pipeline.tokenize.split import PAD_HASH

MAX_READ_THREADS = 4  # each thread holds the compressed and decompressed bytes of its shard
DIGEST_BLOCK = 1 << 20  # bytes of rows digested at a time: a block stays in a 2 MiB L2 cache


def _tokenizer(manifest: dict | None, not_checked: list, folder: Path | None):
    """The build's tokenizer, to show token texts: its copy in `folder` (a local build), else the
    file it was read from (tokenize/kept.py), or None with a note."""
    if not manifest:
        return None
    from longpack.pipeline.tokenize.kept import load_build_tokenizer

    if manifest["tokenizer"].get("source") is None:  # `pack import` without --tokenizer
        not_checked.append("token texts: the build records no tokenizer (pack import without "
                           "--tokenizer)")
        return None
    tokenizer, why = load_build_tokenizer(manifest["tokenizer"], folder)
    if tokenizer is None:
        not_checked.append(f"token texts: the build's tokenizer cannot be loaded here ({why})")
    return tokenizer


FEW_VAL_ROWS = 8  # below it, a val split is a sample or two: its loss measures little


def _scan(name: str, path: Path, eos_id, vocab, seq, verify, problems, not_checked, tokenizer,
          other_hashes, open_reader=SplitReader) -> tuple[dict, SplitScan] | None:
    if not path.is_dir():
        problems.append(Problem(name, "missing (manifest.json lists this split)"))
        return None
    try:
        reader = open_reader(path, eos_id)
    except ShardError as e:
        problems.append(Problem(name if e.path == path else f"{name}/{e.path.name}", e.what))
        return None
    problems += file_checks(name, reader, verify)
    # Only val keeps its document hashes (train is checked against them as it streams by); a
    # train split that kept its own would hold 8 bytes per document, all of them at once.
    scan = SplitScan(name, eos_id, vocab, verify, problems, seq=seq, keep_hashes=name == "val",
                     other_hashes=other_hashes)
    for shard, d in _read_ahead(reader, eos_id, 1 if verify else VOCAB_SAMPLE, vocab):
        if isinstance(shard, ShardError):
            if not any(p.file == f"{name}/{shard.path.name}" for p in problems):
                problems.append(Problem(f"{name}/{shard.path.name}", shard.what))
            scan.lost_shard()
            continue
        scan.add(shard, d)
    if not len(reader.format):
        not_checked.append(f"{name}: no rows (the build made none: --val-fraction 0, or too few "
                           "documents for its share)")
    elif not scan.has_segments:
        not_checked.append(f"{name}: no document hashes recorded: split overlap not checked")
    report = scan.report(reader.stored_bytes(), reader.format, tokenizer.result())
    if name == "val" and 0 < report["rows"] < FEW_VAL_ROWS:
        docs = report.get("documents")
        not_checked.append(
            f"val: {report['rows']} row{'s' if report['rows'] > 1 else ''}"
            + (f" ({docs:,} documents)" if docs is not None else "")
            + f": a val loss over fewer than {FEW_VAL_ROWS} rows is noise, not a measure; "
            "rebuild with a larger --val-fraction for one")
    return report, scan


def read_threads() -> int:
    """One reading thread per core this process may use, at most MAX_READ_THREADS. One rule for
    every format: A/B runs on the 2-core machine (tools/bench_stats.py, warm and cold page cache)
    found the per-format plans that stood here (a thread more than the cores for raw shards,
    asking the kernel for the next compressed files ahead with posix_fadvise) within the runs'
    noise, so they went; the per-thread shard buffer (formats/base.py) stayed: a fresh one per
    64 MiB memmap shard cost 40-50% more CPU (MDS shards: no difference measured)."""
    usable = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1)
    return min(usable, MAX_READ_THREADS)


def _read_ahead(reader: SplitReader, eos_id, count_every: int, vocab_size: int | None):
    """(shard, digest) in order, the next shards read, decompressed and digested in background
    threads while one is folded in: file reads, zstd and the numpy loops release the GIL, so the
    cores work on several shards at once, and one shard more than the threads is queued so
    that a thread never waits for the in-order fold. Memory: each thread's kept shard buffer
    (formats/base.py), the segments and digests of the shards queued ahead and of the one being
    folded in. Closing early cancels the shards not yet started and returns at once."""
    threads = read_threads()
    depth = threads + 1
    n = len(reader.format)

    def load(i):
        try:
            shard = reader.read_blocks(i, DIGEST_BLOCK)
            return shard, digest(shard, eos_id, count_every, vocab_size)
        except ShardError as e:
            return e, None

    pool = ThreadPoolExecutor(threads, thread_name_prefix="read-shard")
    try:
        ahead = deque(pool.submit(load, i) for i in range(min(depth, n)))
        for i in range(n):
            shard = ahead.popleft().result()
            if i + depth < n:
                ahead.append(pool.submit(load, i + depth))
            yield shard
    finally:  # the shards being read end in their threads; the rest never start
        pool.shutdown(wait=False, cancel_futures=True)


def _agree_with_manifest(name: str, got: dict, manifest: dict, problems: list):
    want = manifest["splits"].get(name)
    if want is None:
        return
    pairs = [("rows", "rows"), ("shards", "shards"), ("padding_tokens", "padding_tokens"),
             ("real_tokens", "tokens"), ("documents", "documents")]
    for ours, theirs in pairs:
        if ours in got and got[ours] != want[theirs]:
            problems.append(Problem(name, f"shards hold {got[ours]:,} {theirs.replace('_', ' ')}"
                                          f", manifest.json says {want[theirs]:,}"))


def _totals_agree(manifest: dict, problems: list) -> None:
    """The manifest's totals are its splits' sums (both written by one build)."""
    counts = manifest.get("counts")
    for key in ("tokens", "documents"):
        total = sum(split.get(key) or 0 for split in manifest["splits"].values())
        if isinstance(counts, dict) and counts.get(key) != total:
            problems.append(Problem("manifest.json", f"counts.{key} is {counts.get(key)!r}, its "
                                    f"splits' {key} add up to {total:,}", fix=FIX_REBUILD))


SPLIT_KEYS = ("split_documents", "tokens_in_split_documents", "documents_longer_than_row",
              "tokens_in_documents_longer_than_row")  # present with an EOS id (scan.py)


def _total(splits: dict) -> dict:
    keys = ("shards", "rows", "bytes_on_disk", "raw_bytes", "tokens", "real_tokens",
            "padding_tokens", "documents")
    total = {k: sum(s.get(k) or 0 for s in splits.values()) for k in keys}
    total["compression_ratio"] = (total["raw_bytes"] / total["bytes_on_disk"]
                                  if total["bytes_on_disk"] else None)
    total["bytes_per_token"] = (total["bytes_on_disk"] / total["tokens"]
                                if total["tokens"] else None)
    total["padding_share"] = (total["padding_tokens"] / total["tokens"] if total["tokens"]
                              else None)
    if any(SPLIT_KEYS[0] in s for s in splits.values()):
        total.update({k: sum(s.get(k) or 0 for s in splits.values()) for k in SPLIT_KEYS})
        real = total["real_tokens"]
        total["split_share"] = total["tokens_in_split_documents"] / real if real else None
        total["split_share_floor"] = (total["tokens_in_documents_longer_than_row"] / real
                                      if real else None)
    return total


def collect(path, verify: bool = False, throughput: float | None = None,
            budget: float | None = None, eos_id: int | None = None) -> dict:
    """The report of the build at `path`: a local folder, or a URL (remote.py: the
    manifest and indexes fetched, each shard streamed through a temporary folder once)."""
    if is_url(str(path)):
        from longpack.pipeline.stats.remote import RemoteView

        with RemoteView(str(path), verify) as remote:
            report = _collect(remote.local, verify, throughput, budget, eos_id, remote.reader)
            report["path"] = remote.url
            return report
    return _collect(Path(path), verify, throughput, budget, eos_id, SplitReader)


def _collect(path: Path, verify: bool, throughput, budget, eos_id, open_reader) -> dict:
    manifest, split_dirs, lost = open_output(Path(path))
    problems: list[Problem] = [lost] if lost else []
    not_checked: list[str] = []
    tok_info = manifest["tokenizer"] if manifest else None
    if tok_info:
        eos_id, vocab = tok_info["eos_id"], tok_info["vocab_size"]
    else:
        vocab = None
        not_checked.append("manifest.json absent: counts, tokenizer and vocabulary range not "
                           "checked")
        if eos_id is None:
            not_checked.append("no EOS id (pass --eos-id): documents, their lengths and "
                               "boundaries not computed")
    # Loading the tokenizer (only to show the top tokens as text) overlaps the scan.
    loader = ThreadPoolExecutor(1, thread_name_prefix="load-tokenizer")
    tokenizer = loader.submit(_tokenizer, manifest, not_checked, _root(path, manifest))
    loader.shutdown(wait=False)
    splits, scans = {}, {}
    order = sorted(split_dirs, key=lambda s: s != "val")  # val first: train checks against it
    for name in order:
        val = scans.get("val")
        other = (np.unique(np.concatenate(val.hashes)) if val is not None and val.hashes
                 else None)
        result = _scan(name, split_dirs[name], eos_id, vocab, manifest and manifest["seq"],
                       verify, problems, not_checked, tokenizer,
                       other if name != "val" else None, open_reader)
        if result:
            splits[name], scans[name] = result
    if manifest and "val" not in manifest["splits"]:
        not_checked.append("val: the build has no val split (train runs without a val loss; "
                           "train/val overlap does not arise)")
    if "train" in scans and scans["train"].overlap:
        problems.append(Problem("val", f"{scans['train'].overlap:,} documents are in both "
                                       "train and val", fix="re-run pack build with --overwrite"))
    if manifest:
        for name, got in splits.items():
            _agree_with_manifest(name, got, manifest, problems)
        _totals_agree(manifest, problems)
        log = manifest.get("skipped_log")
        at_root = open_reader is SplitReader and (path / "manifest.json").is_file()  # local
        if at_root and isinstance(log, str) and not (path / log).is_file():
            problems.append(Problem(log, "missing (manifest.json names it: the records the build "
                                         "skipped)", fix=FIX_REBUILD))
        copy = tokenizer_copy_problem(manifest, _root(path, manifest))
        if copy:
            problems.append(copy)
    if not verify:
        not_checked.append("checksums and row-level checks (token ids, document starts, "
                           "continued documents' hashes): pass --verify")
    splits = {k: splits[k] for k in sorted(splits, key=lambda s: s != "train")}
    train = splits.get("train") or next(iter(splits.values()), {})
    return {"path": str(path), "format": manifest["format"] if manifest else None,
            "tokenizer": tok_info, "splits": splits, "total": _total(splits),
            "checks": {"verified": verify, "ok": not problems,
                       "problems": [vars(p) for p in problems], "not_checked": not_checked},
            "recommendations": recommendations(train.get("real_tokens", 0), throughput,
                                               budget, vocab)}


def _root(path: Path, manifest: dict | None) -> Path | None:
    """The build's folder (OUT) of `path`, OUT or one of its splits; None without a manifest."""
    if manifest is None:
        return None
    return path if (path / "manifest.json").is_file() else path.parent


def tokenizer_copy_problem(manifest: dict, root: Path) -> Problem | None:
    """The build's copy of its tokenizer, missing or not of the manifest's sha256, as a
    problem (a remote build's copy is fetched into `root` with its manifest: remote.py)."""
    tok = manifest["tokenizer"]
    what = copy_problem(tok, root)
    return Problem(str(tok.get("file")), what, fix=copy_fix(tok)) if what else None


def _n(x, digits=2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}"


def _share(x) -> str:
    return f"{100 * x:.1f}%" if x is not None else "-"


def _count_share(count, share) -> str:
    return "-" if count is None else f"{count:,} ({_share(share)})"


def human(n: float, unit: str = "") -> str:
    for suffix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{suffix}{unit}"
    return f"{n:.0f}{unit}"


def human_duration(seconds: float) -> str:
    h, rest = divmod(int(seconds), 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def render(r: dict) -> str:
    names = list(r["splits"]) + ["total"]
    cols = {**r["splits"], "total": r["total"]}
    tok = r["tokenizer"]
    head = f"pack stats {r['path']}  ({r['format'] or 'no manifest'}"
    if tok:
        head += f", tokenizer {tokenizer_label(tok)}"
    lines = [head + ")", f"  {'':22}" + "".join(f"{n:>16}" for n in names)]

    def row(label, key, fmt=_n):
        lines.append(f"  {label:22}" + "".join(f"{fmt(cols[n].get(key)):>16}" for n in names))

    row("shards", "shards")
    row("rows", "rows")
    lines.append(f"  {'seq / dtype':22}" + "".join(
        f"{str(cols[n].get('seq') or '-') + ' ' + str(cols[n].get('dtype') or '-'):>16}"
        for n in r["splits"]))
    row("bytes on disk", "bytes_on_disk", lambda x: human(x, "B") if x is not None else "-")
    row("compression ratio", "compression_ratio")
    row("bytes per token", "bytes_per_token", lambda x: _n(x, 3))
    row("tokens", "tokens")
    row("  real", "real_tokens")
    row("  padding", "padding_tokens")
    row("  padding share", "padding_share", _share)
    row("documents", "documents")
    # documents split across rows, and those longer than a row (the floor every packing
    # splits), each with its tokens' share of the real tokens
    for label, count, share in (("split across rows", "split_documents", "split_share"),
                                ("longer than a row", "documents_longer_than_row",
                                 "split_share_floor")):
        lines.append(f"  {label:22}" + "".join(
            f"{_count_share(cols[n].get(count), cols[n].get(share)):>16}" for n in names))
    row("documents per row", "documents_per_row")
    row("rows with a boundary", "rows_with_boundary_fraction",
        lambda x: f"{100 * x:.1f}%" if x is not None else "-")
    for name, s in r["splits"].items():
        d = s.get("doc_length")
        if d:
            lines.append(f"  doc length ({name})".ljust(24) + f"mean {d['mean']:,.0f}  median "
                         f"{d['median']:,}  p10 {d['p10']:,}  p90 {d['p90']:,}  p99 "
                         f"{d['p99']:,}  max {d['max']:,}")
            bars = d["histogram"]
            peak = max(bars["counts"]) or 1
            spark = "".join(" ▁▂▃▄▅▆▇█"[min(8, -(-8 * c // peak))] for c in bars["counts"])
            lines.append(f"{'':24}histogram, bins 1..{bars['edges'][-1]:,} doubling: {spark}")
        v = s["vocab"]
        if not v["distinct_ids"]:
            lines.append(f"  vocab ({name})".ljust(24) + "no tokens")
            continue
        top = ", ".join(f"{t['text']!r} {100 * t['fraction']:.1f}%" if t["text"] is not None
                        else f"#{t['id']} {100 * t['fraction']:.1f}%" for t in v["top"][:6])
        sampled = (f" (counts from {100 * v['counted_fraction']:.0f}% of tokens; --verify "
                   "counts all)" if v["counted_fraction"] < 0.999 else "")
        lines.append(f"  vocab ({name})".ljust(24) + f"ids {v['min_id']}..{v['max_id']}, "
                     f"{v['distinct_ids']:,} distinct{sampled}; top: {top}")
    c = r["checks"]
    lines.append("  checks".ljust(24) + ("OK" if c["ok"] else f"{len(c['problems'])} PROBLEMS")
                 + (" (verified: checksums, ids, document starts, continuations)"
                    if c["verified"] else ""))
    for p in c["problems"][:20]:
        lines.append("    " + Problem(**p).line())
    if len(c["problems"]) > 20:
        lines.append(f"    ... and {len(c['problems']) - 20} more (--json lists all)")
    for note in c["not_checked"]:
        lines.append(f"    not checked: {note}")
    rec = r["recommendations"]
    lines.append(recommend_line(rec))
    if "epochs_for_budget" in rec and rec["epochs_for_budget"] is not None:
        lines.append(f"{'':24}a {human(rec['budget_tokens'])}-token budget is "
                     f"{rec['epochs_for_budget']:.2f} epochs over train")
    if "epoch_seconds" in rec:
        more = (f", the budget {human_duration(rec['budget_seconds'])}"
                if "budget_seconds" in rec else "")
        lines.append(f"{'':24}at {human(rec['throughput_tokens_per_second'])} tokens/s one "
                     f"epoch takes {human_duration(rec['epoch_seconds'])}{more}")
    return "\n".join(lines)


def recommend_line(rec: dict, tokens: str = "train tokens") -> str:
    """The compute-optimal size for `rec["train_tokens"]` (what they are: `tokens`) and the
    presets near it (also the mixture's line, mix.py)."""
    presets = ", ".join(f"{p['name']} ({human(p['params'])}" + (
        f", {human(p['active_params'])} active)" if p["active_params"] != p["params"] else ")")
        for p in rec["presets"]) or "none in archs/ within 0.5x-2x"
    vocab = (f"at vocab {rec['vocab_size']:,}" if rec["vocab_size"] is not None
             else "each at its own vocab (no manifest)")
    return ("  recommend".ljust(24) + f"{human(rec['compute_optimal_params'])} parameters is "
            f"compute-optimal for {human(rec['train_tokens'])} {tokens} "
            f"({rec['tokens_per_param']} tokens/param); presets near it, {vocab}: {presets}")


@dataclass
class FoundRow:
    manifest: dict | None
    tokens: np.ndarray
    starts: np.ndarray
    hashes: np.ndarray | None
    before: int | None  # the last token of the row before (None for row 0)
    tokenizer: object | None = None  # with `decode`: the build's, from its checked copy


def find_row(path, split: str, row: int, eos_id, decode: bool = False) -> FoundRow:
    """Row `row` of a split and the last token of the row before, reading only the shards that
    hold them (at a URL: fetching only those). `decode`: first refuse, in one line, a build
    whose copy of its tokenizer is missing or not of its manifest's sha256, then load the
    tokenizer from that copy; at a URL the copy is the one fetched with the manifest and just
    checked, read while the fetched build is there (not the `source` it was built from, which
    may be another machine's path, or gone)."""
    if is_url(str(path)):
        from longpack.pipeline.stats.remote import RemoteView

        with RemoteView(str(path), verify=False) as remote:
            return _find_row(remote.local, split, row, eos_id, remote.reader,
                             remote.url if decode else None)
    return _find_row(Path(path), split, row, eos_id, SplitReader, str(path) if decode else None)


def _find_row(path: Path, split: str, row: int, eos_id, open_reader,
              decode_as: str | None) -> FoundRow:
    """`decode_as`: the build as the user named it, to check its tokenizer's copy and load the
    tokenizer (None: neither)."""
    manifest, split_dirs, _ = open_output(Path(path))
    if decode_as is not None and manifest:
        copy = tokenizer_copy_problem(manifest, _root(Path(path), manifest))
        if copy:
            raise LongpackError(f"--decode {decode_as}: {copy.file}: {copy.what}, so the row's "
                                f"ids cannot be read as text with it; {copy.fix}")
    if split not in split_dirs:
        raise LongpackError(f"{path}: no split {split!r} (has: {', '.join(split_dirs)})")
    reader = open_reader(split_dirs[split], eos_id)
    tokens, starts, hashes = _read_row(reader, split, row)
    before = int(_read_row(reader, split, row - 1)[0][-1]) if row > 0 else None
    tokenizer = (_tokenizer(manifest, [], _root(Path(path), manifest))
                 if decode_as is not None else None)
    return FoundRow(manifest, tokens, starts, hashes, before, tokenizer)


def _read_row(reader: SplitReader, split: str, row: int):
    """(tokens, starts, hashes or None) of one row, reading only the shard that holds it."""
    first = 0
    for i in range(len(reader.shard_files())):
        n = reader.rows_in_shard(i)
        if row < first + n:
            shard = reader.read_shard(i)
            r = row - first
            tokens = np.asarray(shard.tokens[r])
            if shard.segments is None:
                from longpack.pipeline.formats.shards import starts_from_eos
                return tokens, starts_from_eos(tokens, reader.eos_id), None
            seg = shard.segments[shard.segments[:, 0] == r]
            return tokens, seg[:, 1].astype(np.int64), seg[:, 2]
        first += n
    raise LongpackError(f"row {row} is past the end of {split} ({first:,} rows)")


def decode_row(path: Path, split: str, row: int, eos_id=None) -> str:
    found = find_row(path, split, row, eos_id, decode=True)
    tokens, starts, hashes, tokenizer = found.tokens, found.starts, found.hashes, found.tokenizer
    # A row opens with the rest of a document exactly when the row before does not end in EOS
    # (a row ending in padding ends in the pad id, EOS).
    eos = (eos_id if eos_id is not None
           else ((found.manifest or {}).get("tokenizer") or {}).get("eos_id"))
    continued = found.before is not None and eos is not None and found.before != eos
    bounds = list(starts) + [len(tokens)]
    out = [f"{split} row {row}: {len(tokens):,} tokens, {len(starts)} segments"]
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        h = None if hashes is None else int(hashes[k])
        if h == PAD_HASH:
            out.append(f"\n⟦padding: {b - a:,} tokens⟧")
            continue
        label = "continued document" if k == 0 and continued else "document"
        out.append(f"\n⟦{label}" + (f" {h:016x}" if h is not None else "") +
                   f", tokens {a:,}..{b - 1:,}⟧")
        piece = tokens[a:b]
        out.append(tokenizer.decode(piece) if tokenizer else " ".join(map(str, piece.tolist())))
    return "\n".join(out)


def plot(report: dict, out: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LongpackError(f"--plot needs matplotlib: {install_hint('plots')}") from None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, s in report["splits"].items():
        d = s.get("doc_length")
        if d:
            edges = d["histogram"]["edges"]
            left.stairs(d["histogram"]["counts"], edges, label=name)
        curve = s["vocab"]["rank_fractions"]
        if curve["ranks"]:
            right.loglog(curve["ranks"], curve["fractions"], "o-", label=name)
    left.set_xscale("log", base=2)
    left.set_xlabel("document length (tokens)")
    left.set_ylabel("documents")
    left.set_title("document lengths")
    left.legend()
    right.set_xlabel("rank")
    right.set_ylabel("fraction of tokens")
    right.set_title("token frequency by rank")
    right.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    write_bytes(out, png.getvalue())  # whole or not at all, a failure in one line
