"""`pack import`'s splits (import_tokens.py): which split each source file goes to, and
--val-fraction's hash split of a source that has no val.

Names. SRC's units are its .npy, .npz, .pt and .bin files and its dataset folders (a folder holding
index.json: MDS, or a longpack split, read whole), in path order. A unit's split is read from
the words of its path below SRC (cut at anything but a letter or digit, lower-cased):
  val, valid, validation       val    (nanoGPT's val.bin, llm.c's *_val_*.bin, fairseq's
                                       valid.bin, llm-foundry's val/ and val_small/)
  train, training              train
  test, testing, heldout, holdout      refused: import writes train and val only, and a test
                                       split must not be trained on; whether it should be the
                                       val split is the user's call (name it so)
A unit whose path names two splits (train/val_x.npy, train_val.bin) is refused. If no unit's
path names a split, every unit is train (a source without val: --val-fraction may make one).
If some do, a unit whose path names none (a loose file beside train/ and val/, all.bin beside
train.bin and val.bin) is refused: it may be either split, or both (a concatenation), and a
guess would put validation data into train or leave data out unseen. SRC's own name is not
read (a file or folder imported alone is the train split, with a warning when its name says
val or test), so the same folder gives the same splits wherever it lies. Files of other
suffixes (nanoGPT's meta.pkl, README) are not token data and are not units.

--val-fraction F (--seed S). Each unit moves to val as pack build's documents do:
`Splitter(F, S).is_val(h)` (docs/FORMAT.md), h being XXH3-64 (0 -> 1) of the unit's ids as
little-endian uint32:
  with an EOS id, the unit is a document: the kept rows' tokens in order, cut after each EOS
  (rows span document boundaries, so the rows are cut apart and each split's documents packed
  again into rows of --seq, the final partial row padded with EOS as pack build pads, and the
  split's document hashes numbered again); h is of the document's first SPLIT_PREFIX ids, so
  that only the open document waits in memory. A document runs on across files, and across a
  row skipped for its ids (the pieces either side of it are one document); the stream's last
  piece, with no EOS, is a document too.
  without one, the unit is a row (each row is one document then), and rows stay as they are:
  a document of the source that spans rows may then have pieces in both splits, which a
  warning says.
Identical documents (rows) land in the same split. Cost: one XXH3 and one Splitter per
document (row), a Python step each.
"""

import re
from pathlib import Path

import numpy as np
import xxhash

from longpack.core import SettingsError
from longpack.pipeline.tokenize.split import Splitter

WORDS = {"val": "val", "valid": "val", "validation": "val", "train": "train",
         "training": "train", "test": "test", "testing": "test", "heldout": "test",
         "holdout": "test"}
SPLIT_PREFIX = 1024  # ids of a document that its split is drawn from


def split_files(src: Path, suffixes: tuple[str, ...], warn) -> dict[str, list[Path]]:
    """{split: units}, train first, each in path order; SettingsError for a unit whose split
    cannot be told."""
    if not src.exists():
        raise SettingsError(f"{src}: no such file or directory")
    own = _names(src.name)
    if own - {"train"}:
        warn(f"pack import: {src}'s name says {'val' if 'val' in own else 'test'} data, but it "
             "is the whole source: imported as the train split (splits are read from the names "
             "below SRC: import a folder that holds it as val.bin or val/ to make it val)")
    units = [src] if src.is_file() or (src / "index.json").is_file() else _units(src, suffixes)
    if not units:
        raise SettingsError(f"{src}: no {', '.join(suffixes)} files to import")
    named = {u: _names(_below(src, u)) for u in units}
    for u, names in named.items():
        if len(names) > 1:
            raise SettingsError(f"{u}: its path names both {' and '.join(sorted(names))} "
                                f"({_below(src, u)}): rename or move it so that it names one "
                                "split")
        if names == {"test"}:
            raise SettingsError(f"{u} names a test split, which pack import does not write (it "
                                "writes train and val): move it out of SRC, or name it val to "
                                "validate on it")
    labelled = [u for u in units if named[u]]
    loose = [u for u in units if not named[u]]
    if labelled and loose:
        raise SettingsError(
            f"{src}: {_below(src, loose[0])} names no split, while "
            f"{_below(src, labelled[0])} does ({len(loose)} file{'s' * (len(loose) > 1)} name "
            "none): its split cannot be told, so it is not guessed: move it into train/ or "
            "val/ (or name it so), or out of SRC")
    _refuse_twice(src, units)
    found = {s: [u for u in units if named[u] == {s} or (s == "train" and not named[u])]
             for s in ("train", "val")}
    return {s: us for s, us in found.items() if us}


def _refuse_twice(src: Path, units: list[Path]) -> None:
    """Two names of one file (a link, or a linked folder reached twice): its rows would be
    imported twice, in one split or in both."""
    first: dict[Path, Path] = {}
    for u in units:
        real = u.resolve()
        if real in first:
            kind = "folder" if u.is_dir() else "file"
            raise SettingsError(f"{u} and {first[real]} are the same {kind} ({real}): its rows "
                                f"would be imported twice; remove one of them from {src}")
        first[real] = u


def _units(folder: Path, suffixes, seen: frozenset = frozenset()) -> list[Path]:
    """Files of `suffixes` and dataset folders (index.json; not looked into), in path order.
    A linked folder is followed, once on each path (a link to a folder above is no loop)."""
    seen = seen | {folder.resolve()}
    out = []
    for p in sorted(folder.iterdir()):
        if p.is_dir():
            if (p / "index.json").is_file():
                out.append(p)
            elif p.resolve() not in seen:
                out += _units(p, suffixes, seen)
        elif p.is_file() and p.suffix in suffixes:
            out.append(p)
    return sorted(out)


def _below(src: Path, unit: Path) -> str:
    return unit.relative_to(src).as_posix() if unit != src else ""


def _names(path: str) -> set[str]:
    return {WORDS[w] for w in re.split(r"[^a-z0-9]+", path.lower()) if w in WORDS}


class HashSplit:
    """The rows of a source without val, to `splits["train"]` and `splits["val"]` (import's
    _Split: `add(rows)`, `add_last(tokens)`) by --val-fraction; see the module's docstring."""

    def __init__(self, splits: dict, val_fraction: float, seed: int, eos: int | None,
                 seq: int):
        self.splits, self.splitter = splits, Splitter(val_fraction, seed)
        self.eos, self.seq = eos, seq
        self.open: list[np.ndarray] = []  # the open document's pieces while its split is drawn
        self.open_len, self.to = 0, None  # its length so far; its split, once drawn
        self.carry = {s: [] for s in splits}  # each split's tokens not yet whole rows

    def add(self, rows: np.ndarray) -> None:
        if self.eos is None:
            val = np.array([self._is_val(row) for row in rows], bool)
            for name, pick in (("train", ~val), ("val", val)):
                if pick.any():
                    self.splits[name].add(rows[pick])
            return
        flat = rows.reshape(-1)
        cuts = np.flatnonzero(flat == self.eos) + 1
        start = 0
        for end in cuts.tolist():
            self._piece(flat[start:end], ends=True)
            start = end
        if start < len(flat):
            self._piece(flat[start:], ends=False)
        for name in self.splits:
            self._rows(name)

    def cut(self) -> None:
        """A skipped row: the document runs on over it (one stream of kept rows)."""

    def flush(self) -> None:
        """After the last rows: the open document and each split's last tokens."""
        if self.open:
            self._draw()
        for name, split in self.splits.items():
            self._rows(name)
            if self.carry[name]:
                split.add_last(self.carry[name][0])

    def _piece(self, tokens: np.ndarray, ends: bool) -> None:
        if self.to is None:
            self.open.append(tokens)
            self.open_len += len(tokens)
            if ends or self.open_len >= SPLIT_PREFIX:
                self._draw()
        else:
            self.carry[self.to].append(tokens)
        if ends:
            self.to = None

    def _draw(self) -> None:
        doc = np.concatenate(self.open)
        self.to = "val" if self._is_val(doc[:SPLIT_PREFIX]) else "train"
        self.carry[self.to].append(doc)
        self.open, self.open_len = [], 0

    def _rows(self, name: str) -> None:
        tokens = np.concatenate(self.carry[name]) if self.carry[name] else np.zeros(0)
        whole = len(tokens) // self.seq * self.seq
        if whole:
            self.splits[name].add(tokens[:whole].reshape(-1, self.seq))
        self.carry[name] = [tokens[whole:]] if whole < len(tokens) else []

    def _is_val(self, ids: np.ndarray) -> bool:
        return self.splitter.is_val(xxhash.xxh3_64_intdigest(ids.astype("<u4").tobytes()) or 1)
