"""OUT/manifest.json: exactly what went in and what came out, and the end-of-build summary.

Written last (atomically), so its presence means the build is complete. docs/FORMAT.md
documents every field. Just before it, the build's tokenizer file is copied into OUT
(`keep_tokenizer`: OUT/tokenizer.tiktoken or OUT/tokenizer.json, which the manifest's
"tokenizer"."file" names), so the build carries what gives its ids their meaning wherever it
is moved or read from.
"""

import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from longpack.pipeline.formats import get_format

FORMAT_VERSION = 1


def longpack_version() -> str:
    try:
        return version("longpack")
    except PackageNotFoundError:
        return "unknown"


# What makes two builds' ids mean the same thing (a manifest's "tokenizer"): not where the
# tokenizer file was read from, nor which engine encoded.
TOKENIZER_IDENTITY = ("name", "kind", "sha256", "vocab_size", "eos_id")


# what every reader of a manifest (pack stats, the trainer, zoo) relies on, and its type
MANIFEST_KEYS = {"format": str, "seq": int, "tokenizer": dict, "splits": dict}
TOKENIZER_KEYS = ("name", "source", "sha256", "vocab_size", "eos_id")
# what each of them (and the copy's "file", where a build keeps one) may hold: an imported
# build's tokenizer has no source, sha256 or file (import_tokens.py)
TOKENIZER_TYPES = {"name": (str,), "source": (str, type(None)), "sha256": (str, type(None)),
                   "vocab_size": (int,), "eos_id": (int, type(None)), "file": (str,)}
KIND_WORDS = {str: "text", int: "a whole number", type(None): "null"}  # JSON's, as users read
SPLIT_KEYS = ("rows", "shards", "padding_tokens", "tokens", "documents")


def manifest_lacks(manifest, also: dict | None = None) -> list[str]:
    """What of MANIFEST_KEYS (and `also`: more keys and their types) a manifest.json's content
    lacks or holds as another type, named as dotted paths; [] for a sound one."""
    keys = {**MANIFEST_KEYS, **(also or {})}
    if not isinstance(manifest, dict):
        return ["everything: it is not a JSON object"]
    lacks = [k for k, kind in keys.items() if not isinstance(manifest.get(k), kind)]
    if not lacks:
        tok = manifest["tokenizer"]
        lacks = [f"tokenizer.{k}" for k in TOKENIZER_KEYS if k not in tok]
        lacks += [f"tokenizer.{k} as {' or '.join(KIND_WORDS[t] for t in kinds)}"
                  for k, kinds in TOKENIZER_TYPES.items()
                  if k in tok and not (isinstance(tok[k], kinds) and not isinstance(tok[k], bool))]
        if isinstance(tok.get("file"), str) and (Path(tok["file"]).name != tok["file"]
                                                 or tok["file"] in ("", "..")):
            lacks.append("tokenizer.file as a file name of the build's folder")
        lacks += [f"splits.{s}.{k}" for s, split in manifest["splits"].items() for k in SPLIT_KEYS
                  if not isinstance(split, dict) or k not in split]
    return lacks


def refuse_nothing_packed(counts: dict, skip_log: Path) -> None:
    """A build that packed no document is an error, not an empty build that looks complete:
    its inputs held no record (empty files), or every record was skipped (a wrong
    --text-field or --dataset, most often)."""
    from longpack.core import InputError

    if counts["documents"]:
        return
    if not counts["records_read"]:
        raise InputError("the inputs hold no record (empty files): nothing to pack; check "
                         "--input (no manifest written)")
    reasons = ", ".join(f"{n:,} {r}" for r, n in sorted(counts["skipped"].items()) if n)
    raise InputError(f"no document packed: all {counts['records_read']:,} records were skipped "
                     f"({reasons}; {skip_log} lists them); check --text-field and --dataset "
                     "(no manifest written)")


def same_tokenizer(a: dict | None, b: dict | None) -> bool:
    """Whether two manifests' tokenizers give ids the same meaning (None: not known)."""
    if a is None or b is None:
        return a is b
    return all(a.get(k) == b.get(k) for k in TOKENIZER_IDENTITY)


def tokenizer_label(tok: dict | None) -> str:
    """A manifest's tokenizer in a few words: its name, its file's sha256 and its vocabulary."""
    if tok is None:
        return "no manifest"
    if tok.get("kind") == "imported":
        return f"imported ids (no tokenizer, vocabulary {tok.get('vocab_size'):,})"
    sha = f"sha256 {tok['sha256'][:12]}, " if tok.get("sha256") else ""
    return f"{tok.get('name')} ({sha}vocabulary {tok.get('vocab_size'):,})"


def empty_counts(splits, reasons) -> dict:
    split = {"documents": 0, "tokens": 0, "text_bytes": 0, "padding_tokens": 0,
             "dropped_tokens": 0}
    return {"records_read": 0, "documents": 0, "tokens": 0,
            "skipped": {r: 0 for r in reasons}, "splits": {s: dict(split) for s in splits}}


def _split_outputs(fmt: str, folder: Path, index: dict, seq: int) -> dict:
    shards = get_format(fmt)(folder, index)
    rows = sum(shards.rows_in(i) for i in range(len(shards)))
    nbytes = sum(f.bytes for i in range(len(shards)) for f in shards.stored(i))
    return {"rows": rows, "shards": len(shards), "bytes": nbytes, "row_tokens": rows * seq}


def keep_tokenizer(tokenizer: dict, out: Path, claim) -> dict:
    """OUT's copy of the build's tokenizer file (tokenize/kept.py's COPY_NAMES by kind),
    claimed in OUT's journal (`claim`: its Journal.claim) and written atomically, the same bytes
    whoever builds (a worker, a task's merge, an engine); the identity with "file" naming it.
    An imported build without a tokenizer keeps none."""
    from longpack.core import write_bytes
    from longpack.pipeline.tokenize.kept import COPY_NAMES, tokenizer_bytes

    name = COPY_NAMES.get(tokenizer.get("kind"))
    if name is None:
        return tokenizer
    data = tokenizer_bytes(tokenizer)
    claim(out / name)
    write_bytes(out / name, data, fsync=True)
    return {**tokenizer, "file": name}


def make_manifest(cfg, fingerprint: dict, tokenizer: dict, engine: dict, inputs: list[dict],
                  counts: dict, indexes: dict, out: Path, timings: dict, claim) -> dict:
    """`tokenizer`, `engine`: the Tokenizer's identity() and engine_identity(). Writes OUT's
    copy of the tokenizer (keep_tokenizer), which the manifest names: the one file this
    writes, as the manifest is to be written right after it."""
    tokenizer = keep_tokenizer(tokenizer, out, claim)
    splits = {}
    for name, index in indexes.items():
        splits[name] = {**counts["splits"][name], **_split_outputs(cfg.format, out / name, index,
                                                                  cfg.seq),
                        "path": name}
    return {
        "longpack_version": longpack_version(),
        "format_version": FORMAT_VERSION,
        "format": cfg.format,
        "seq": cfg.seq,
        "dtype": tokenizer["dtype"],
        "tokenizer": tokenizer,
        "tokenizer_engine": engine,  # never in the fingerprint: ids do not depend on it
        "pad_id": tokenizer["eos_id"],
        "document_order": "input files sorted by path, then records in file order",
        # best-fit's window and rule (a concat build's manifest has no such key, as before it)
        **({"packing": fingerprint["packing"]} if "packing" in fingerprint else {}),
        "settings": cfg.settings_of("output", "recorded"),
        "inputs": inputs,
        "counts": {k: v for k, v in counts.items() if k != "splits"},
        "splits": splits,
        "skipped_log": "skipped.jsonl",
        "timings": timings,
        "fingerprint": fingerprint,
    }


def already_complete(m: dict, out: str) -> str:
    """What a re-run of a finished build says before its summary: it wrote nothing."""
    finished = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m["timings"]["finished"]))
    return (f"pack build: {out} is already complete (finished {finished}): nothing to do; "
            "the summary is that build's. --overwrite rebuilds it.")


# Below this many tokens a row holds less context than a paragraph: a long-context build's rows
# are thousands (--seq 32768 by default), while tests build rows of 4 to 64 tokens on purpose.
SHORT_SEQ = 64


def short_rows(m: dict) -> str | None:
    """A line for a build whose rows are tiny (--seq below SHORT_SEQ), with its rows and the
    documents' mean length; None otherwise."""
    seq = m.get("seq") or 0
    if seq >= SHORT_SEQ:
        return None
    rows = sum(s.get("rows", 0) for s in m.get("splits", {}).values())
    docs = sum(s.get("documents", 0) for s in m.get("splits", {}).values())
    tokens = sum(s.get("tokens", 0) for s in m.get("splits", {}).values())
    mean = f", documents average {tokens / docs:,.0f}" if docs else ""
    return (f"--seq {seq}: {rows:,} rows of {seq} tokens{mean}: a model sees at most {seq} "
            "tokens of context; pass the length you will train on (e.g. --seq 2048)")


def summary(m: dict, out: str) -> str:
    c, t = m["counts"], m["timings"]
    packing = f", {m['packing']['packing']}" if m.get("packing") else ""  # concat: as before
    lines = [f"pack build: {out}  ({m['format']}, seq {m['seq']}, {m['dtype']}, "
             f"tokenizer {m['tokenizer']['name']}{packing})",
             f"  inputs      {len(m['inputs'])} files, {sum(i['size'] for i in m['inputs']):,} bytes",
             f"  read        {c['records_read']:,} records -> {c['documents']:,} documents, "
             f"{c['tokens']:,} tokens"]
    skipped = {k: v for k, v in c["skipped"].items() if v}
    if skipped:
        lines.append("  skipped     " + ", ".join(f"{k} {v:,}" for k, v in skipped.items())
                     + f"  (each one in {out.rstrip('/')}/{m['skipped_log']})")
    else:
        lines.append("  skipped     none")
    for name, s in m["splits"].items():
        lines.append(f"  {name:<11} {s['documents']:,} docs, {s['tokens']:,} tokens -> "
                     f"{s['rows']:,} rows in {s['shards']} shards, {s['bytes']:,} bytes; "
                     f"padding {s['padding_tokens']:,}, dropped {s['dropped_tokens']:,}")
    short = short_rows(m)
    if short:
        lines.append(f"  warning     {short}")
    engine = m.get("tokenizer_engine") or {}
    if engine.get("note"):  # why fastokens did not encode (auto), or tasks ran other engines
        lines.append(f"  note        {engine.get('library')} encoded; {engine['note']}")
    rate = t.get("steady_tokens_per_second")
    rate_text = f", {rate / 1e6:.2f} M tokens/s steady" if rate else ""
    if t.get("tasks"):  # a build split into tasks: its rate over the wall time of them all
        rate = t.get("tokens_per_second")
        rate_text = (f" in {t['tasks']} task{'s' if t['tasks'] > 1 else ''}"
                     + (f", {rate / 1e6:.2f} M tokens/s" if rate else ""))
    resumed = f" (resumed; run {t['runs']})" if t.get("resumed") else ""
    lines.append(f"  time        {t['seconds']:.1f} s{rate_text}{resumed}")
    return "\n".join(lines)
