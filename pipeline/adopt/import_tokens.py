"""`pack import SRC --out OUT`: adopt token data another tool wrote as a longpack build.

    import_tokens(ImportConfig(src="seed/", out="./imported", eos_id=50256))

SRC is a file or a folder. Its splits come from the names below it (splits.py): a file or
folder named val (val.bin, *_val_*.bin, valid.bin, val/, val_small/) is val, one named train is
train, and with no such names all of it is train; a test split, a file without a split's name
beside files with one, or one named for two, is refused rather than guessed. --val-fraction F
gives a source without val a hash split of whole documents (of rows without an EOS id), as
pack build draws its own. Files (and dataset folders), sorted by path, by their suffix:
  .npy   [N, seq] integer arrays (memory-mapped: rows are read as they are written out)
  .npz   numpy.savez archives: each array in order, an [N, seq] array as a .npy, a 1-D array
         a token stream cut into rows of --seq as a .bin (its tail dropped and counted)
  .pt    [N, seq] integer tensors (torch.load(..., weights_only=True): no code is run)
  .bin   a flat run of --dtype tokens (nanoGPT's train.bin), cut into rows of --seq; the tokens
         after the last whole row are dropped and counted
  a folder holding an MDS index.json (llm-foundry's and others'): its `tokens` column, an
         ndarray of any integer type or legacy bytes (int64), read a shard at a time
Every row is checked: a file whose rows are not --seq long (or not as long as the first
file's) is skipped whole, a row holding an id below 0 or not below the vocabulary is skipped;
each skip is a line of skipped.jsonl (file, row, reason) and a count in the manifest, as in
`pack build`. The vocabulary is --tokenizer's (recorded in the manifest; a warning when the
data's largest id is below half of it: a smaller tokenizer's ids fit unnoticed), else the
largest id + 1 (with a warning: the trainer sizes the model's embedding from it), and then an
id of MAX_VOCAB or more is refused: no vocabulary is that large, the bytes are of another type.
Kept ids are in [0, vocab), which the output's dtype holds: nothing is cast with wraparound
(comparisons are exact for uint64 and int64 alike, `at_least`).

The files are read by readers.py. Refused before anything is written, in one line naming
the file (and row and id): an empty or truncated file; a .npy of Python objects (never
unpickled: its header is read first); a .pt whose pickle holds more than tensors (torch refuses
it unrun), or that holds no dense integer tensor; anything but [N, seq] integer ids, in an MDS
tokens column too; a .bin whose size is not whole --dtype ids (BIN_DTYPES); an --eos-id not
below the vocabulary.

Documents: with --eos-id (or --tokenizer: its EOS) each row's segments start at 0 and after
each EOS, and a row that begins inside a document (the row before did not end with EOS)
continues that document's hash; without either each row is one document. A document's hash
numbers it (doc_hash of its ordinal in the split): the data carries no text to hash. The rows
(under --val-fraction with an EOS id, each split's documents packed again: splits.py,
the final row padded with EOS) are copied into shards of --format (an MDS shard or a memmap
.npy holds its own header and the documents' segments, so no source layout is one of them as
it stands). The output is written as `pack build` writes one (a lock, a journal of the files,
index.json after the shards, manifest.json last); an interrupted import is run again from the
start by the same command.
"""

import json
import os
import time
from pathlib import Path

import numpy as np

from longpack.core import InputError, SettingsError, settings_of, write_bytes, write_json, writing
from longpack.pipeline.adopt.config import ImportConfig
from longpack.pipeline.adopt.readers import SUFFIXES, at_least, read_blocks
from longpack.pipeline.adopt.splits import HashSplit, split_files
from longpack.pipeline.config import WORK_DIR
from longpack.pipeline.formats import get_format
from longpack.pipeline.formats.base import rows_per_shard
from longpack.pipeline.manifest import FORMAT_VERSION, keep_tokenizer, longpack_version
from longpack.pipeline.store.lock import OutputLock
from longpack.pipeline.store.output_dir import Journal, prepare_output, remove_work_files
from longpack.pipeline.tokenize.split import PAD_HASH, doc_hash

BLOCK_ROWS = 4096  # rows checked and packed at a time
# Without --tokenizer the vocabulary is the largest id + 1: above this it is no vocabulary but
# bytes read as the wrong type (a trainer's int32 ids, an embedding of 2**31 rows).
MAX_VOCAB = 2**31 - 1


class _Split:
    """One split's shards, written as their rows come."""

    def __init__(self, name: str, out: Path, cfg: ImportConfig, seq: int, dtype, journal,
                 eos_id: int | None):
        self.name, self.folder, self.journal = name, out / name, journal
        self.fmt = get_format(cfg.format).for_writing(
            self.folder, seq, dtype, get_format(cfg.format).default_compression, cfg.shard_bytes)
        self.per_shard = rows_per_shard(cfg.shard_bytes, seq, np.dtype(dtype).itemsize)
        self.seq, self.dtype, self.eos = seq, np.dtype(dtype), eos_id
        self.rows: list[np.ndarray] = []
        self.buffered = 0
        self.entries: list[dict] = []
        self.counts = {"rows": 0, "documents": 0, "tokens": 0, "padding_tokens": 0}
        self.doc, self.open_doc = 0, False  # the current document's ordinal; it continues
        self.real_last = None  # the final row's tokens before its padding (add_last)
        with writing(self.folder):
            self.folder.mkdir(parents=True, exist_ok=True)

    def add(self, rows: np.ndarray) -> None:
        """Rows whose ids _add_rows checked: all in [0, vocab), which the dtype holds."""
        self.rows.append(rows.astype(self.dtype))
        self.buffered += len(rows)
        while self.buffered >= self.per_shard:
            self._write(self.per_shard)

    def add_last(self, tokens: np.ndarray) -> None:
        """The split's final tokens, fewer than a row (--val-fraction repacks documents): padded
        with EOS as pack build pads, the padding a segment of hash 0."""
        row = np.full((1, self.seq), self.eos, self.dtype)
        row[0, :len(tokens)] = tokens
        self.real_last = len(tokens)
        self.add(row)

    def cut(self) -> None:
        """A skipped row ends the document before it."""
        self.open_doc = False

    def _segments(self, rows: np.ndarray, real_last: int | None) -> np.ndarray:
        """(row, start, hash) of each document piece, as the packer records them; the last
        row's tokens from `real_last` on are padding."""
        out = []
        for r, row in enumerate(rows):
            if real_last is not None and r == len(rows) - 1:
                row = row[:real_last]
            starts = [0]
            if self.eos is not None:
                starts += [int(p) + 1 for p in np.flatnonzero(row[:-1] == self.eos)]
            for i, start in enumerate(starts):
                if not (i == 0 and self.open_doc):
                    self.doc += 1
                out.append((r, start, doc_hash(f"{self.name}:{self.doc}")))
            # documents as pack stats counts them: those an EOS ends (each row, without one)
            self.counts["documents"] += int((row == self.eos).sum()) if self.eos is not None else 1
            self.open_doc = self.eos is not None and row[-1] != self.eos
        if real_last is not None:
            out.append((len(rows) - 1, real_last, PAD_HASH))
        return np.array(out, dtype=np.uint64).reshape(-1, 3)

    def _write(self, n: int) -> None:
        rows = np.concatenate(self.rows)
        take, rest = rows[:n], rows[n:]
        self.rows, self.buffered = [rest] if len(rest) else [], len(rest)
        real_last = self.real_last if not len(rest) else None  # add_last's row is the last
        files, entry = self.fmt.encode_shard(len(self.entries), take,
                                             self._segments(take, real_last))
        for name, data in files.items():
            self.journal.claim(self.folder / name)
            write_bytes(self.folder / name, data, fsync=True)
        self.entries.append(entry)
        padding = self.seq - real_last if real_last is not None else 0
        self.counts["rows"] += n
        self.counts["tokens"] += n * self.seq - padding
        self.counts["padding_tokens"] += padding

    def close(self) -> dict:
        if self.buffered:
            self._write(self.buffered)

        index = self.fmt.index_json(self.entries)
        self.journal.claim(self.folder / "index.json")
        write_json(self.folder / "index.json", index, fsync=True)
        written = type(self.fmt)(self.folder, index)
        stored = sum(f.bytes for i in range(len(self.entries)) for f in written.stored(i))
        return {**self.counts, "text_bytes": None, "dropped_tokens": 0,
                "shards": len(self.entries), "bytes": stored,
                "row_tokens": self.counts["rows"] * self.seq, "path": self.name}


def import_tokens(cfg: ImportConfig, warn=print) -> dict:
    """Write OUT; returns its manifest."""
    t0 = time.time()
    src, out = Path(os.path.abspath(cfg.src)), Path(cfg.out)  # recorded from any folder alike
    if out.exists() and not out.is_dir():
        raise SettingsError(f"--out {out} is a file, not a folder: give a new or empty folder")
    _refuse_overlap(src, out)
    files = split_files(src, SUFFIXES, warn)
    if cfg.dtype is not None and not any(u.suffix == ".bin" for us in files.values() for u in us):
        raise SettingsError(f"--dtype {cfg.dtype}: {src} holds no .bin file (a .npy or .pt "
                            "records its own type); drop --dtype")
    if cfg.val_fraction and "val" in files:
        raise SettingsError(f"--val-fraction {cfg.val_fraction}: {src} already has a val split "
                            f"({files['val'][0]}): drop --val-fraction to import it as it is")
    tok = None
    if cfg.tokenizer:
        from longpack.pipeline.tokenize.tokenizer import load_tokenizer

        tok = load_tokenizer(cfg.tokenizer)
    eos = cfg.eos_id if cfg.eos_id is not None else (tok.eos_id if tok else None)
    if cfg.val_fraction and eos is None:
        warn("pack import: --val-fraction without --eos-id each row is a document and moves "
             "whole: a document that spans rows may have pieces in both splits; pass --eos-id "
             "to move whole documents")
    inputs = [{"path": str(f), "size": f.stat().st_size, "mtime_ns": f.stat().st_mtime_ns,
               "split": name}
              for name, split in files.items() for p in split
              for f in (sorted(p.iterdir()) if p.is_dir() else [p]) if f.is_file()]
    settings = settings_of(cfg, "output")
    # Without a val fraction the seed changes no byte: the fingerprint leaves both out.
    fingerprint = {"import": {k: v for k, v in settings.items() if cfg.val_fraction
                              or k not in ("val_fraction", "seed")},
                   "inputs": inputs,
                   # not where its file was read from (as a build's): the ids' meaning
                   "tokenizer": ({k: v for k, v in tok.identity().items() if k != "source"}
                                 if tok else None),
                   "format_version": FORMAT_VERSION}
    seq, largest = _scan(files, cfg, tok is None)
    if seq is None or seq < 2:
        raise SettingsError(f"{src}: rows of {seq} tokens; a row needs at least 2")
    fmt = get_format(cfg.format)
    fmt.check_settings(seq, cfg.shard_bytes, None if fmt.default_compression == "none"
                       else fmt.default_compression)
    vocab = _vocabulary(cfg, tok, largest, warn)
    dtype = np.uint16 if vocab <= 1 << 16 else np.uint32  # holds every id below vocab
    with OutputLock(out / WORK_DIR):
        found = prepare_output(out, fingerprint, cfg.overwrite)
        if found == "complete":
            return json.loads((out / "manifest.json").read_text())
        journal = Journal(out)
        try:
            return _write(cfg, files, out, seq, vocab, dtype, tok, eos, inputs, fingerprint,
                          journal, t0)
        finally:
            journal.close()


def _refuse_overlap(src: Path, out: Path) -> None:
    """OUT neither SRC, nor in it, nor holding it: a build written there would replace or
    become its own input (with --overwrite, SRC's files removed before they are read)."""
    s, o = src.resolve(), out.resolve()
    if s == o or o in s.parents or s in o.parents:
        where = "is" if s == o else "holds" if o in s.parents else "is inside"
        raise SettingsError(f"--out {out} {where} SRC {src}: the import would write over its own "
                            "input; give an --out outside SRC")


def _scan(files: dict[str, list[Path]], cfg: ImportConfig, check_ids: bool):
    """The first pass, before anything is written: (row width, largest id) over the rows of that
    width (--seq, else the first file's). With `check_ids` (no --tokenizer: the vocabulary is
    the largest id + 1) an id of MAX_VOCAB or more is refused, naming its file, row and value,
    rather than recorded as a vocabulary or cast into the output's dtype."""
    seq, largest = cfg.seq, 0
    for units in files.values():
        for path in units:
            first = 0  # the source's row number of the block's first row, as _write counts
            for rows in read_blocks(path, cfg):
                if seq is None:
                    seq = rows.shape[1]
                if rows.shape[1] == seq and len(rows):
                    top = int(rows.max())
                    if check_ids and top >= MAX_VOCAB:
                        row, value = _first_at_least(rows, MAX_VOCAB)
                        raise InputError(
                            f"{path}: row {first + row} holds id {value:,}, beyond any "
                            f"vocabulary ({MAX_VOCAB:,} ids at most without --tokenizer), so "
                            "these are not token ids as stored (bytes of another dtype?): fix "
                            "the file, or pass --tokenizer to skip rows beyond its vocabulary")
                    largest = max(largest, top)
                first += len(rows)
    return seq, largest


def _first_at_least(rows: np.ndarray, value: int) -> tuple[int, int]:
    """(row, id) of the first id >= value, a block at a time (rows may be a memory map)."""
    for a in range(0, len(rows), BLOCK_ROWS):
        block = np.asarray(rows[a:a + BLOCK_ROWS])
        hit = np.flatnonzero(at_least(block, value).any(1))
        if len(hit):
            row = block[hit[0]]
            return a + int(hit[0]), int(row[at_least(row, value)][0])
    raise AssertionError("no such id")


def _vocabulary(cfg: ImportConfig, tok, largest: int, warn) -> int:
    """The vocabulary size the manifest records (every kept id is below it), checked against
    --eos-id and, with --tokenizer, the data's largest id."""
    if tok is None:
        vocab = largest + 1
        warn(f"pack import: no --tokenizer: the vocabulary is taken as the largest id + 1 "
             f"({vocab:,}), which sizes the model's embedding; pass --tokenizer to record the "
             "real one")
    else:
        vocab = tok.vocab_size
        if vocab > 1 << 32:
            raise SettingsError(f"--tokenizer {cfg.tokenizer}: a vocabulary of {vocab:,} ids "
                                "does not fit uint32 tokens")
        if largest < vocab // 2:  # a smaller tokenizer's ids fit, and would be mislabelled
            warn(f"pack import: the largest id in {cfg.src} is {largest:,}, and --tokenizer "
                 f"{cfg.tokenizer} has {vocab:,}: if the ids are another tokenizer's, pass that "
                 "one (the manifest records this one, and the model's embedding its size)")
    if cfg.eos_id is not None and cfg.eos_id >= vocab:
        raise SettingsError(
            f"--eos-id {cfg.eos_id} is not an id of --tokenizer {cfg.tokenizer} (its vocabulary "
            f"has {vocab:,})" if tok else
            f"--eos-id {cfg.eos_id} is above every id in {cfg.src} (the largest is {largest:,}), "
            "so no document would end: check the id, or pass --tokenizer")
    return vocab


def _add_rows(rows, path: Path, first: int, seq: int, vocab: int, split, skip) -> None:
    """A block of a source's rows into the split (a _Split, or a HashSplit of two), those of
    another width or with an id out of the vocabulary skipped (numbered from `first`)."""
    if rows.shape[1] != seq:
        skip(path, first, "wrong_length", f"rows of {rows.shape[1]} tokens, not {seq}",
             records=len(rows))
        return
    for a in range(0, len(rows), BLOCK_ROWS):
        block = np.asarray(rows[a:a + BLOCK_ROWS])
        bad = (~at_least(block, 0)).any(1) | at_least(block, vocab).any(1)
        for r in np.flatnonzero(bad):
            skip(path, first + a + int(r), "id_out_of_range",
                 f"ids {int(block[r].min())}..{int(block[r].max())}, the vocabulary has {vocab}")
        if (~bad).any():
            split.add(block[~bad])
            if bad.any():
                split.cut()


def _write(cfg, files, out, seq, vocab, dtype, tok, eos, inputs, fingerprint, journal,
           t0) -> dict:
    skipped: dict[str, int] = {}
    skip_path = out / "skipped.jsonl"
    journal.claim(skip_path)
    splits = {}
    read = 0
    with writing(skip_path), open(skip_path, "wb") as log:
        def skip(path, row, reason, detail, records=1):
            skipped[reason] = skipped.get(reason, 0) + records
            log.write((json.dumps({"file": str(path), "row": row, "reason": reason,
                                   "detail": detail, "records": records}) + "\n").encode())

        for name, units in files.items():
            writers = {name: _Split(name, out, cfg, seq, dtype, journal, eos)}
            split = writers[name]
            if cfg.val_fraction:  # the source has no val (import_tokens refused it): make one
                writers["val"] = _Split("val", out, cfg, seq, dtype, journal, eos)
                split = HashSplit(writers, cfg.val_fraction, cfg.seed, eos, seq)
            for path in units:
                first = 0  # the source's row number of the block's first row
                tails = []  # a .npz's token streams' tails
                for rows in read_blocks(path, cfg, tails):
                    _add_rows(rows, path, first, seq, vocab, split, skip)
                    first += len(rows)
                read += first
                for row, tail, name in tails:
                    skip(path, row, "partial_row", f"the last {tail} tokens of array {name!r} "
                         f"do not fill a row of {seq}")
                if path.suffix == ".bin":
                    tail = os.path.getsize(path) // np.dtype(cfg.dtype).itemsize % seq
                    if tail:
                        skip(path, first, "partial_row", f"the last {tail} tokens do not "
                             f"fill a row of {seq}")
            if isinstance(split, HashSplit):
                split.flush()
            splits.update((n, w.close()) for n, w in writers.items())
    tokenizer = {**(tok.identity() if tok else {"name": "imported", "kind": "imported",
                                                  "source": None, "sha256": None}),
                 "vocab_size": vocab, "eos_id": eos, "dtype": np.dtype(dtype).name}
    totals = {k: sum(s[k] for s in splits.values()) for k in ("documents", "tokens")}
    if not totals["tokens"]:  # no manifest: OUT does not look like a (empty) build
        if not read:
            raise InputError(f"{cfg.src}: its files hold no rows: nothing to import")
        reasons = ", ".join(f"{n:,} {r}" for r, n in sorted(skipped.items()))
        raise InputError(f"{cfg.src}: no row imported ({read:,} rows read; {reasons}: "
                         f"{skip_path} says which and why); check --seq, --dtype and the ids")
    if tok is not None:  # a copy of its file in OUT, as a build keeps one
        tokenizer = keep_tokenizer(tokenizer, out, journal.claim)
    manifest = {
        "longpack_version": longpack_version(), "format_version": FORMAT_VERSION,
        "format": cfg.format, "seq": seq, "dtype": np.dtype(dtype).name,
        "tokenizer": tokenizer, "tokenizer_engine": None, "pad_id": eos,
        "document_order": "imported files sorted by path, rows in file order",
        "imported_from": os.path.abspath(cfg.src), "settings": settings_of(cfg, "output"),
        "inputs": inputs,
        "counts": {"records_read": read, **totals,
                   "skipped": skipped},
        "splits": splits, "skipped_log": "skipped.jsonl",
        "timings": {"started": t0, "finished": time.time(), "seconds": time.time() - t0},
        "fingerprint": fingerprint,
    }
    journal.claim(out / "manifest.json")
    write_json(out / "manifest.json", manifest, fsync=True)
    remove_work_files(out)
    return manifest
