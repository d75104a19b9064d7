"""`pack build --packing best-fit` (pipeline/pack/best_fit.py): the packer's properties, then
whole builds (any --workers, killed and resumed, split into tasks: the same bytes). Ray, Slurm
and an S3 --out are in tests/test_engine_ray.py, test_engine_slurm.py, test_remote_build.py."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_texts, write_jsonl
from longpack.core.errors import SettingsError
from longpack.pipeline.cli import pack
from longpack.pipeline.manifest import summary
from longpack.pipeline.pack.best_fit import WINDOW_ROWS, BestFitPacker, describe
from longpack.pipeline.tokenize.split import PAD_HASH

EOS = 9
HASH0 = 2**63 + 12345  # document i's hash is HASH0 + i: each needs all 64 bits


def make_docs(lengths):
    """Document i is its own id (i + 10) repeated, then EOS: every token says whose it is."""
    return [np.array([i + 10] * (n - 1) + [EOS], np.uint16) for i, n in enumerate(lengths)]


def pack_all(docs, seq, window_rows, cuts=(), resumes=()):
    """Every document through add() in batches cut at `cuts`; before each batch starting at a
    document in `resumes`, the packer is replaced by one made from its state() (a checkpoint
    and a resume). Returns (rows, segments with rows numbered over the split, padding,
    dropped)."""
    packer = BestFitPacker(seq, np.uint16, EOS, window_rows=window_rows)
    rows, segs, made = [], [], 0
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(docs)} | set(resumes)), len(docs)]
    for a, b in zip(bounds, bounds[1:]):
        if a in resumes:
            state = {k: v.copy() for k, v in packer.state().items()}
            packer = BestFitPacker(seq, np.uint16, EOS, window_rows=window_rows, **state)
        if a == b:
            continue
        part = docs[a:b]
        r, s = packer.add(np.concatenate(part), np.array([len(d) for d in part]),
                          np.arange(a, b, dtype=np.uint64) + np.uint64(HASH0))
        rows.append(r)
        segs.append(s + np.array([made, 0, 0], np.uint64))
        made += len(r)
    r, s, padding, dropped = packer.finish("pad", pad_id=EOS)
    rows.append(r)
    segs.append(s + np.array([made, 0, 0], np.uint64))
    return np.concatenate(rows), np.concatenate(segs), padding, dropped


def pieces_of(rows, segs):
    """Each row's segments as (row, start, end, hash), in row order."""
    out = []
    for r in range(len(rows)):
        s = segs[segs[:, 0] == r]
        ends = [*s[1:, 1].tolist(), rows.shape[1]]
        out += [(r, int(a), int(e), int(h)) for (_, a, h), e in zip(s.tolist(), ends)]
    return out


def check_packing(docs, seq, window_rows, rows, segs, padding):
    """What FORMAT.md promises of a best-fit split, checked one property at a time."""
    lengths = [len(d) for d in docs]
    assert rows.shape[1:] == (seq,) and segs.dtype == np.uint64
    assert padding == rows.size - sum(lengths)
    for r in range(len(rows)):  # a segment at 0 in every row, starts increasing
        starts = segs[segs[:, 0] == r, 1].astype(np.int64)
        assert starts[0] == 0 and np.all(np.diff(starts) > 0)
    found = {}  # document -> its pieces, in row order
    pad_seen = 0
    for r, a, e, h in pieces_of(rows, segs):
        if h == PAD_HASH:  # padding: the row's last segment, pad ids only
            assert e == seq and np.all(rows[r, a:] == EOS)
            pad_seen += e - a
            continue
        found.setdefault(h - HASH0, []).append((r, a, rows[r, a:e]))
        if a > 0:  # a later start is a document's first token, right after an EOS
            assert rows[r, a - 1] == EOS and len(found[h - HASH0]) == 1
    assert pad_seen == padding
    assert sorted(found) == list(range(len(docs)))  # every document, none twice
    concat_start = np.cumsum([0, *lengths])
    for i, got in found.items():
        assert np.array_equal(np.concatenate([p for _, _, p in got]), docs[i])  # in row order
        if lengths[i] <= seq:
            assert len(got) == 1  # a document that fits a row is never split
        else:  # full rows, then the remainder opening the next row: consecutive rows
            assert len(got) == -(-lengths[i] // seq)
            assert [r for r, _, _ in got] == list(range(got[0][0], got[0][0] + len(got)))
            assert all(a == 0 for _, a, _ in got)
        # the rows of a window hold only its documents
        window = concat_start[i] // (window_rows * seq)
        for r, _, _ in got:
            others = {h - HASH0 for h in segs[segs[:, 0] == r, 2].tolist() if h != PAD_HASH}
            assert {int(concat_start[j] // (window_rows * seq)) for j in others} == {window}
    # best fit: a document opened a new row only when no earlier row of its window had room
    room, window_of, opener = {}, {}, {}
    for r, a, e, h in pieces_of(rows, segs):
        if h == PAD_HASH:
            room[r] = e - a
            continue
        window_of[r] = concat_start[h - HASH0] // (window_rows * seq)
        if a == 0 and lengths[h - HASH0] <= seq:
            opener[r] = lengths[h - HASH0]
    for r, n in opener.items():
        assert all(room.get(q, 0) < n for q in range(r) if window_of[q] == window_of[r])
    # FORMAT.md's continuation rule: a row opens with the previous row's last document exactly
    # when that row does not end with EOS, and then carries its hash
    for r in range(1, len(rows)):
        first = segs[segs[:, 0] == r][0]
        before = segs[segs[:, 0] == r - 1][-1]
        continued = rows[r - 1, -1] != EOS
        assert continued == (int(first[2]) == int(before[2]) != PAD_HASH
                             and len(found[int(first[2]) - HASH0]) > 1)


docs_strategy = st.lists(st.integers(1, 40), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(docs_strategy, st.integers(2, 24), st.integers(1, 4))
def test_every_document_is_whole_or_cut_only_when_longer_than_a_row(lengths, seq, window_rows):
    docs = make_docs(lengths)
    rows, segs, padding, dropped = pack_all(docs, seq, window_rows)
    assert dropped == 0
    check_packing(docs, seq, window_rows, rows, segs, padding)


@settings(max_examples=300, deadline=None)
@given(docs_strategy, st.integers(2, 24), st.integers(1, 4),
       st.lists(st.integers(1, 39), max_size=6), st.lists(st.integers(0, 39), max_size=3))
def test_the_bytes_do_not_depend_on_batches_nor_on_checkpoints(lengths, seq, window_rows, cuts,
                                                              resumes):
    """The build calls add() with batches whose bounds follow --workers, and a resumed build
    goes on from a checkpoint's state(): neither may change a byte."""
    docs = make_docs(lengths)
    whole = pack_all(docs, seq, window_rows)
    cut = pack_all(docs, seq, window_rows, cuts, [r for r in resumes if r < len(docs)])
    for a, b in zip(whole, cut):
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b


def test_documents_go_longest_first_into_the_fullest_row_that_holds_them():
    """seq 10: 7, 6, then 5 fits neither row's room (3, 4) and opens a row; the second 5 fills
    it, 4 the 6's row, 3 the 7's row: no padding, and no document cut (concat cuts three)."""
    docs = make_docs([3, 7, 4, 6, 5, 5])
    rows, segs, padding, _ = pack_all(docs, 10, window_rows=64)
    h = [HASH0 + i for i in range(6)]
    assert padding == 0 and segs.tolist() == [
        [0, 0, h[1]], [0, 7, h[0]], [1, 0, h[3]], [1, 6, h[2]], [2, 0, h[4]], [2, 5, h[5]]]


def test_a_long_document_fills_rows_and_its_remainder_opens_the_next():
    docs = make_docs([2, 9, 1])
    rows, segs, padding, _ = pack_all(docs, 4, window_rows=64)
    h = [HASH0 + i for i in range(3)]
    assert padding == 0 and segs.tolist() == [
        [0, 0, h[1]], [1, 0, h[1]], [2, 0, h[1]], [2, 1, h[0]], [2, 3, h[2]]]
    assert rows.tolist() == [[11] * 4, [11] * 4, [EOS, 10, EOS, EOS]]


def test_windows_are_packed_apart_and_rows_end_in_marked_padding():
    """seq 4, one row a window: W = 4 tokens. Window 0 holds the 2 and the 3 (which
    starts at 2), window 1 the 1: it cannot take the room the 3 leaves in window 0's row."""
    docs = make_docs([2, 3, 1])
    rows, segs, padding, _ = pack_all(docs, 4, window_rows=1)
    h = [HASH0 + i for i in range(3)]
    assert padding == 6 and segs.tolist() == [
        [0, 0, h[1]], [0, 3, PAD_HASH], [1, 0, h[0]], [1, 2, PAD_HASH], [2, 0, h[2]],
        [2, 1, PAD_HASH]]
    assert rows.tolist() == [[11, 11, EOS, EOS], [10, EOS, EOS, EOS], [EOS] * 4]


def test_best_fit_has_no_last_row_to_drop():
    """Every row may end in padding: --last-row drop is refused (BuildConfig, below)."""
    with pytest.raises(ValueError, match="best-fit pads every row"):
        BestFitPacker(4, np.uint16, EOS).finish("drop", EOS)


def test_an_empty_split_makes_no_row():
    rows, segs, padding, dropped = BestFitPacker(8, np.uint16, EOS).finish("pad", EOS)
    assert rows.shape == (0, 8) and segs.shape == (0, 3) and (padding, dropped) == (0, 0)


def test_a_window_is_packed_once_its_tokens_reach_its_end():
    """Memory stays bounded: a window is not held past its last document."""
    packer = BestFitPacker(4, np.uint16, EOS, window_rows=2)
    rows, _ = packer.add(np.arange(7, dtype=np.uint16), np.array([3, 4]),
                         np.array([5, 6], np.uint64))
    assert len(rows) == 0 and packer.held == 7
    rows, _ = packer.add(np.arange(2, dtype=np.uint16), np.array([2]), np.array([7], np.uint64))
    assert len(rows) == 3 and packer.held == 0 and packer.position == 9


# -- whole builds ------------------------------------------------------------------------------

def build_files(out: Path) -> dict[str, bytes]:
    """The build's files, manifest.json without what may differ between runs of one build."""
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
             if p.is_file()}
    m = json.loads(files.pop("manifest.json"))
    for key in ("timings",):
        m.pop(key)
    m["settings"].pop("workers")
    files["manifest.json"] = json.dumps(m, sort_keys=True).encode()
    return files


def documents_of(out: Path, split: str, eos_id: int) -> list[tuple[int, bytes]]:
    """(hash, token bytes) of each document of a build's split, read as FORMAT.md says: a row
    whose previous row does not end with EOS opens with that row's last document."""
    from longpack.pipeline.formats.shards import open_split

    docs, last_token = [], eos_id
    for row, starts, hashes in open_split(out / split).rows():
        ends = [*starts[1:].tolist(), len(row)]
        for k, (a, e, h) in enumerate(zip(starts.tolist(), ends, hashes.tolist())):
            if h == PAD_HASH:
                continue
            piece = np.asarray(row[a:e]).astype(np.int64)
            if k == 0 and last_token != eos_id:
                assert docs[-1][0] == h
                docs[-1] = (h, docs[-1][1] + piece.tobytes())
            else:
                docs.append((h, piece.tobytes()))
        last_token = int(row[-1])
    return docs


def sample_build(out: Path, seq: int, **kw) -> dict:
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    return build(BuildConfig(out=str(out), dataset="fineweb-edu-sample", tokenizer="gpt2",
                             seq=seq, val_fraction=0.05, shard_bytes=seq * 2 * 64, **kw),
                 show_progress=False)


@pytest.mark.slow
def test_the_shipped_sample_packed_best_fit_is_the_same_for_any_worker_count(tmp_path):
    """And it holds concat's documents, each whole unless longer than a row. best-fit is the
    default: a build without --packing is the one with --packing best-fit, byte for byte."""
    seq = 512
    one = sample_build(tmp_path / "one", seq, packing="best-fit", workers=1)
    two = sample_build(tmp_path / "two", seq, workers=2)  # the default
    concat = sample_build(tmp_path / "concat", seq, packing="concat", workers=2)
    assert build_files(tmp_path / "one") == build_files(tmp_path / "two")
    for workers in (1, 2):  # memmap's shards too
        sample_build(tmp_path / f"memmap{workers}", seq, workers=workers, format="memmap")
    assert build_files(tmp_path / "memmap1") == build_files(tmp_path / "memmap2")
    assert one["packing"] == describe(seq) == one["fingerprint"]["packing"]
    assert one["settings"]["packing"] == "best-fit" and "packing" not in concat
    assert "packing" not in concat["settings"] and "packing" not in concat["fingerprint"]
    assert "tokenizer gpt2, best-fit)" in summary(one, "OUT").splitlines()[0]
    assert "tokenizer gpt2)" in summary(concat, "OUT").splitlines()[0]  # as before --packing
    eos = one["tokenizer"]["eos_id"]
    for split in ("train", "val"):
        s = one["splits"][split]
        assert s["tokens"] + s["padding_tokens"] == s["rows"] * seq
        assert 0 < s["padding_tokens"] < s["tokens"] // 50 or split == "val"
        fitted = documents_of(tmp_path / "one", split, eos)
        assert sorted(fitted) == sorted(documents_of(tmp_path / "concat", split, eos))
        assert len(fitted) == s["documents"] == concat["splits"][split]["documents"]
    assert two["splits"] == one["splits"]


def test_a_concat_build_records_no_packing(tmp_path, byte_tokenizer):
    """Its manifest and fingerprint are those of the builds made before --packing."""
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(20)])
    m = build(BuildConfig(out=str(tmp_path / "out"), dataset="jsonl", inputs=(str(src),),
                          tokenizer=byte_tokenizer, seq=64, val_fraction=0.0, packing="concat"),
              show_progress=False)
    assert "packing" not in m and "packing" not in m["settings"]
    assert set(m["fingerprint"]) == {"settings", "tokenizer", "inputs", "format_version"}
    default = build(BuildConfig(out=str(tmp_path / "default"), dataset="jsonl",
                                inputs=(str(src),), tokenizer=byte_tokenizer, seq=64,
                                val_fraction=0.0), show_progress=False)
    assert default["settings"]["packing"] == "best-fit"
    assert default["packing"] == describe(64) == default["fingerprint"]["packing"]


def test_an_unknown_packing_and_best_fit_with_drop_are_refused_in_one_line(tmp_path):
    from longpack.pipeline.config import BuildConfig

    out = tmp_path / "out"
    with pytest.raises(SettingsError, match="--packing 'bogus': choose one of concat, best-fit"):
        BuildConfig(out=str(out), packing="bogus")
    r = CliRunner().invoke(pack, ["build", "--out", str(out), "--packing", "bogus"])
    assert r.exit_code == 2 and r.output == ("Error: Invalid value for '--packing': 'bogus' is "
                                             "not one of 'concat', 'best-fit' "
                                             "(see 'pack build --help')\n")
    assert not out.exists()
    for packing in (["--packing", "best-fit"], []):  # best-fit, asked for or the default
        r = CliRunner().invoke(pack, ["build", "--out", str(out), *packing, "--last-row", "drop"])
        assert r.exit_code == 1 and r.output.count("\n") == 1 and "Traceback" not in r.output
        assert "--last-row drop drops the one partial row of --packing concat" in r.output
        assert "add --packing concat" in r.output
        assert not out.exists()
    with pytest.raises(SettingsError, match="add --packing concat"):
        BuildConfig(out=str(out), last_row="drop")
    assert BuildConfig(out=str(out), last_row="drop", packing="concat").last_row == "drop"


# Dies by SIGKILL right after the KILL_AT-th checkpoint of this run is in place: the next run
# resumes from a checkpoint whose windows are open (checkpoints every batch, small batches).
KILLED_AFTER_CHECKPOINT = """
import os, signal, sys
from pathlib import Path
import longpack.pipeline.build
import longpack.pipeline.read.batches
from longpack.pipeline.cli import pack

longpack.pipeline.build.CHECKPOINT_SECONDS = 0.0
longpack.pipeline.read.batches.BATCH_CHARS = 2000
kill_at, real_replace, seen = int(sys.argv[1]), os.replace, []

def replace(src, dst):
    real_replace(src, dst)
    if Path(dst).name == "checkpoint.npz":
        seen.append(dst)
        if len(seen) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

os.replace = replace
pack(sys.argv[2:])
"""


@pytest.mark.parametrize("fmt", ["mds", "memmap"])
@pytest.mark.slow
def test_a_best_fit_build_killed_twice_resumes_to_the_same_bytes(tmp_path, byte_tokenizer,
                                                                 fmt):
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(400, seed=3)])
    args = ["build", "--dataset", "jsonl", "--input", str(src), "--tokenizer", byte_tokenizer,
            "--seq", "64", "--val-fraction", "0.1", "--shard-bytes", str(64 * 2 * 16),
            "--format", fmt, "--packing", "best-fit", "--workers", "2", "--quiet"]
    out = tmp_path / "out"
    for kill_at in (3, 4):
        killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_CHECKPOINT, str(kill_at),
                                 *args, "--out", str(out)],
                                capture_output=True, text=True, timeout=300)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        with np.load(out / ".longpack-build" / "checkpoint.npz") as z:  # windows were open
            assert len(z["train_carry"]) and len(z["train_counters"]) == 2
    r = CliRunner().invoke(pack, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["timings"]["resumed"] and m["timings"]["runs"] == 3
    r = CliRunner().invoke(pack, [*args, "--out", str(tmp_path / "clean")])
    assert r.exit_code == 0, r.output
    assert build_files(out) == build_files(tmp_path / "clean")
    assert m["packing"]["window"]["rows"] == WINDOW_ROWS
    assert m["splits"]["train"]["rows"] > WINDOW_ROWS  # more than one window


# -- a build split into tasks (distribute/layout.py's BestFitLayout) ----------------------------

class Streams:
    """SplitStreams' piece() over documents in memory: tokens [a, b) of the split, cut at
    document bounds (a window's are)."""

    def __init__(self, docs):
        self.docs = docs
        self.starts = np.cumsum([0, *map(len, docs)])

    def piece(self, a, b):
        i, j = np.searchsorted(self.starts, [a, b])
        assert self.starts[i] == a and self.starts[j] == b
        part = self.docs[i:j]
        return (np.concatenate(part), np.array([len(d) for d in part]),
                np.arange(i, j, dtype=np.uint64) + np.uint64(HASH0))


@settings(max_examples=200, deadline=None)
@given(docs_strategy, st.integers(2, 12), st.integers(1, 3), st.integers(1, 4),
       st.lists(st.integers(0, 40), max_size=5))
def test_tasks_place_the_single_build_s_shards_each_once(lengths, seq, window_rows, per_shard,
                                                        cuts):
    """Task i, knowing only tasks 0..i, places the full shards whose rows come from windows
    that are whole by then and end in its documents; the merge cuts the rest; together: the
    single build's rows and segments, bit for bit."""
    from longpack.pipeline.distribute.layout import BestFitLayout

    docs = make_docs(lengths)
    want_rows, want_segs, padding, _ = pack_all(docs, seq, window_rows)
    bounds = [0, *sorted({c for c in cuts if c <= len(docs)}), len(docs)]  # tasks, maybe empty
    layout = BestFitLayout(seq, per_shard, window_rows)
    shards = {}
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        layout.extend(lengths[a:b])
        for k in layout.owned(i):
            assert k not in shards and (k + 1) * per_shard <= len(want_rows)
            shards[k] = layout.cut(Streams(docs[:b]), k, EOS)  # nothing of a later task
    layout.close()
    assert layout.rows == len(want_rows) and layout.padding == padding
    for k in range(layout.shards):
        if k not in shards:
            shards[k] = layout.cut(Streams(docs), k, EOS)
        rows, segs = shards[k]
        lo = k * per_shard
        assert np.array_equal(rows, want_rows[lo:lo + per_shard])
        mine = want_segs[(want_segs[:, 0] >= lo) & (want_segs[:, 0] < lo + per_shard)]
        assert np.array_equal(segs, mine - np.array([lo, 0, 0], np.uint64))


def tasked(out: Path, src: Path, tokenizer: str, **kw):
    from longpack.pipeline.config import BuildConfig

    return BuildConfig(out=str(out), dataset="jsonl", inputs=(str(src),), tokenizer=tokenizer,
                       seq=64, val_fraction=0.1, shard_bytes=64 * 2 * 24, packing="best-fit",
                       workers=2, **kw)


@pytest.mark.parametrize("fmt", ["mds", "memmap"])
@pytest.mark.slow
def test_a_best_fit_build_split_into_tasks_gives_the_single_build_s_bytes(tmp_path,
                                                                         byte_tokenizer, fmt):
    import random

    from conftest import build_tree
    from longpack.pipeline.build import build
    from longpack.pipeline.distribute import tasks

    folder = tmp_path / "corpus"
    folder.mkdir()
    texts = make_texts(1500, seed=4)
    for i, (a, b) in enumerate([(0, 300), (300, 310), (310, 900), (900, 1500)]):
        write_jsonl(folder / f"part{i}.jsonl", [{"text": t} for t in texts[a:b]])
    m = build(tasked(tmp_path / "single", folder, byte_tokenizer, format=fmt),
              show_progress=False)
    assert m["splits"]["train"]["rows"] > 2 * WINDOW_ROWS  # windows across tasks
    want = build_tree(tmp_path / "single")
    for n in (3, 5):
        out = tmp_path / f"tasks{n}"
        cfg = tasked(out, folder, byte_tokenizer, format=fmt, tasks=n)
        order = random.Random(n).sample(range(n), n)
        manifests = [tasks.run_task(cfg, i) for i in order]
        assert manifests[-1]["packing"] == m["packing"]
        assert build_tree(out) == want, f"{n} tasks finishing in order {order}"


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["one huge document", "rows shorter than most documents"])
def test_hostile_shapes_build_whole_and_the_same_in_tasks(tmp_path, byte_tokenizer, shape):
    """One document of 41 rows and more (cut into whole rows, its remainder packed), and a
    --seq of 16 under documents of ~100 tokens: every document once, in order within a row's
    pieces; the same bytes from 3 tasks; pack stats' split share at its floor."""
    from conftest import build_tree
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig
    from longpack.pipeline.distribute import tasks
    from longpack.pipeline.stats.report import collect

    folder = tmp_path / "corpus"
    folder.mkdir()
    if shape == "one huge document":
        texts, seq = [" ".join(make_texts(400, seed=7))], 256  # ~41 rows of 256
    else:
        texts, seq = make_texts(300, seed=8), 16
    write_jsonl(folder / "docs.jsonl", [{"text": t} for t in texts])

    def cfg(out, **kw):
        return BuildConfig(out=str(tmp_path / out), dataset="jsonl", inputs=(str(folder),),
                           tokenizer=byte_tokenizer, seq=seq, val_fraction=0.0,
                           shard_bytes=seq * 2 * 16, format="memmap", workers=2, **kw)

    m = build(cfg("single"), show_progress=False)
    concat = build(cfg("concat", packing="concat"), show_progress=False)
    eos = m["tokenizer"]["eos_id"]
    fitted = documents_of(tmp_path / "single", "train", eos)
    assert sorted(fitted) == sorted(documents_of(tmp_path / "concat", "train", eos))
    assert len(fitted) == len(texts) == m["counts"]["documents"]
    for i in range(3):
        tasks.run_task(cfg("tasked", tasks=3), i)
    assert build_tree(tmp_path / "tasked") == build_tree(tmp_path / "single")
    train = collect(tmp_path / "single", verify=True)["splits"]["train"]
    assert train["split_share"] == pytest.approx(train["split_share_floor"], abs=1e-9)
    if shape == "one huge document":
        assert train["split_share"] == 1.0 and m["splits"]["train"]["rows"] > 40
        assert m["splits"]["train"]["padding_tokens"] < seq  # the one row its remainder opens
    assert m["splits"]["train"]["tokens"] == concat["splits"]["train"]["tokens"]


def test_a_refusal_names_what_differs_between_best_fit_fingerprints():
    """A window's tokens follow from --seq: another --seq is named as itself alone; another
    window or rule as another longpack's; a fingerprint without `packing` is concat's."""
    from longpack.pipeline.store.output_dir import differences

    def fingerprint(seq, packing=None):
        found = {"settings": {"seq": seq}}
        if packing:
            found["settings"]["packing"], found["packing"] = "best-fit", packing
        return found

    assert differences(fingerprint(128, describe(128)), fingerprint(64, describe(64))) == (
        "--seq 128 -> 64")
    assert differences(fingerprint(64, describe(64, 128)), fingerprint(64, describe(64))) == (
        "best-fit's window or rule: another longpack packed it")
    assert differences(fingerprint(64), fingerprint(64, describe(64))) == (
        "--packing concat -> best-fit")
    assert differences(fingerprint(64, describe(64)), fingerprint(32)) == (
        "--packing best-fit -> concat; --seq 64 -> 32")


def test_the_tasks_of_a_longpack_before_packing_merge_as_concat(tmp_path, byte_tokenizer):
    """Their tasks.json (unsealed, as records were then) has no `packing`: the merge reads it as
    the concat build it is, not as the default's, and gives the single concat build's bytes."""
    from conftest import build_tree
    from longpack.pipeline.build import build
    from longpack.pipeline.config import WORK_DIR, BuildConfig
    from longpack.pipeline.distribute import tasks
    from longpack.pipeline.distribute.work_folder import SEAL

    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(200, seed=2)])

    def cfg(out, **kw):
        return BuildConfig(out=str(out), dataset="jsonl", inputs=(str(src),),
                           tokenizer=byte_tokenizer, seq=64, val_fraction=0.1,
                           shard_bytes=64 * 2 * 8, workers=1, packing="concat", **kw)

    build(cfg(tmp_path / "single"), show_progress=False)
    out = tmp_path / "tasked"
    for i in range(2):
        assert tasks.run_task(cfg(out, tasks=2), i, merge=False) is None
    path = out / WORK_DIR / "tasks.json"
    record = json.loads(path.read_text())
    assert record["config"].pop("packing") == "concat" and record.pop(SEAL)
    path.write_text(json.dumps(record))
    r = CliRunner().invoke(pack, ["merge", str(out)])
    assert r.exit_code == 0, r.output
    assert build_tree(out) == build_tree(tmp_path / "single")


def test_a_task_or_a_build_packed_otherwise_is_refused_naming_the_packing(tmp_path,
                                                                         byte_tokenizer):
    """The tasks of one build, or a resumed build, cannot mix packings: --packing is in the
    fingerprint (a concat build's leaves it out, as builds before --packing did: a record
    without it is concat's, not the default's)."""
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(60)])
    args = ["build", "--dataset", "jsonl", "--input", str(src), "--tokenizer", byte_tokenizer,
            "--seq", "64", "--val-fraction", "0", "--workers", "1", "--quiet"]
    tasked = [*args, "--out", str(tmp_path / "t"), "--tasks", "2"]
    assert CliRunner().invoke(pack, [*tasked, "--task-index", "0", "--packing", "concat"]
                              ).exit_code == 0
    r = CliRunner().invoke(pack, [*tasked, "--task-index", "1"])  # the default: best-fit
    assert r.exit_code == 1 and r.output.count("\n") == 1
    assert "different settings (--packing concat -> best-fit)" in r.output
    r = CliRunner().invoke(pack, ["merge", str(tmp_path / "t")])
    assert r.exit_code == 1 and "1 of its 2 tasks are not done (task 1)" in r.output
    assert not (tmp_path / "t" / "manifest.json").exists()
    single = [*args, "--out", str(tmp_path / "s")]
    assert CliRunner().invoke(pack, single).exit_code == 0
    r = CliRunner().invoke(pack, [*single, "--packing", "concat"])
    assert r.exit_code == 1 and "(--packing best-fit -> concat)" in r.output
