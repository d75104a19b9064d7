import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_texts, write_jsonl
from longpack.pipeline.pack.packer import RowPacker
from longpack.pipeline.tokenize.split import PAD_HASH, Splitter, doc_hash

EOS = 9


def docs_strategy():
    return st.lists(st.integers(1, 40), min_size=1, max_size=30)


def make_docs(lengths):
    """Document i is [i+10]*(len-1) + [EOS]: each token says which document it belongs to."""
    return [np.array([i + 10] * (n - 1) + [EOS], np.uint16) for i, n in enumerate(lengths)]


def pack_all(docs, seq, cuts, last_row="pad"):
    packer = RowPacker(seq, np.uint16)
    rows, segs, offset = [], [], 0
    bounds = [0, *sorted(set(cuts)), len(docs)]
    for a, b in zip(bounds, bounds[1:]):
        if a == b:
            continue
        part = docs[a:b]
        r, s = packer.add(np.concatenate(part), np.array([len(d) for d in part]),
                          np.arange(a, b, dtype=np.uint64) + 100)
        s[:, 0] += offset
        offset += len(r)
        rows.append(r)
        segs.append(s)
    r, s, padding, dropped = packer.finish(last_row, pad_id=EOS)
    s[:, 0] += offset
    rows.append(r)
    segs.append(s)
    return np.concatenate(rows), np.concatenate(segs), padding, dropped


@settings(max_examples=200, deadline=None)
@given(docs_strategy(), st.integers(2, 50), st.lists(st.integers(0, 30), max_size=5))
@pytest.mark.slow
def test_rows_hold_every_token_in_order_and_segments_mark_documents(lengths, seq, cuts):
    docs = make_docs(lengths)
    rows, segs, padding, dropped = pack_all(docs, seq, [c for c in cuts if c < len(docs)])
    total = sum(lengths)
    assert rows.shape == (-(-total // seq), seq)
    assert dropped == 0 and padding == rows.size - total
    assert np.array_equal(rows.reshape(-1)[:total], np.concatenate(docs))
    # every row's first segment is at 0; starts strictly increase within a row
    for r in range(len(rows)):
        s = segs[segs[:, 0] == r]
        assert s[0, 1] == 0 and np.all(np.diff(s[:, 1].astype(np.int64)) > 0)
    # each segment's hash names the document its first token belongs to (or padding)
    flat = rows.reshape(-1)
    for row, start, h in segs:
        pos = int(row) * seq + int(start)
        if h == PAD_HASH:
            assert pos == total
        else:
            assert flat[pos] == EOS or flat[pos] == h - 100 + 10
            owner = np.searchsorted(np.cumsum(lengths), pos, side="right")
            assert owner == h - 100


@settings(max_examples=100, deadline=None)
@given(docs_strategy(), st.integers(2, 50), st.lists(st.integers(0, 30), max_size=5))
def test_output_does_not_depend_on_how_documents_are_batched(lengths, seq, cuts):
    docs = make_docs(lengths)
    a = pack_all(docs, seq, [])
    b = pack_all(docs, seq, [c for c in cuts if c < len(docs)])
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_drop_policy_counts_the_final_partial_row():
    docs = make_docs([5, 6])
    rows, segs, padding, dropped = pack_all(docs, 4, [], last_row="drop")
    assert rows.shape == (2, 4) and padding == 0 and dropped == 3
    assert segs[:, 0].max() == 1


def test_exact_fit_needs_no_padding():
    rows, segs, padding, dropped = pack_all(make_docs([4, 4]), 4, [])
    assert rows.shape == (2, 4) and padding == 0 and dropped == 0
    assert segs.tolist() == [[0, 0, 100], [1, 0, 101]]


def test_split_is_stable_and_close_to_the_fraction():
    splitter = Splitter(0.1, seed=3)
    hashes = [doc_hash(f"document {i}".encode()) for i in range(20000)]
    picks = [splitter.is_val(h) for h in hashes]
    assert picks == [Splitter(0.1, seed=3).is_val(h) for h in hashes]
    assert 0.09 < np.mean(picks) < 0.11
    assert picks != [Splitter(0.1, seed=4).is_val(h) for h in hashes]
    assert not any(Splitter(0.0, seed=3).is_val(h) for h in hashes)


def test_doc_hash_never_uses_the_padding_value():
    assert doc_hash(b"") != PAD_HASH and doc_hash(b"x") == doc_hash(b"x")


def test_doc_hash_is_of_the_utf8_bytes_and_refuses_lone_surrogates():
    assert doc_hash("δέλτα") == doc_hash("δέλτα".encode())
    with pytest.raises(UnicodeEncodeError):
        doc_hash("a\ud800")


def test_finish_keeps_every_bit_of_the_hashes_it_carries():
    """The final padded row's segments come from the carried (start, hash) pairs: hashes above
    2**53 must come out exactly (a float64 step rounds them), also after a checkpoint's carry
    is handed to a new packer."""
    hashes = np.array([2**64 - 12345, 2**63 + 7, 2**53 + 1], np.uint64)
    packer = RowPacker(8, np.uint16)
    rows, segs = packer.add(np.arange(13, dtype=np.uint16), np.array([4, 6, 3]), hashes)
    assert segs[:, 2].tolist() == [int(hashes[0]), int(hashes[1])]
    resumed = RowPacker(8, np.uint16, packer.carry.copy(), packer.carry_segments.copy())
    for p in (packer, resumed):
        row, segs, padding, _ = p.finish("pad", pad_id=EOS)
        assert segs.dtype == np.uint64 and padding == 3
        assert segs.tolist() == [[0, 0, int(hashes[1])], [0, 2, int(hashes[2])], [0, 5, PAD_HASH]]


class Crash(Exception):
    pass


@pytest.mark.parametrize("fmt", ["mds", "memmap"])
@pytest.mark.parametrize("seq", [64, 8192])
@pytest.mark.parametrize("interrupted", [False, True])
@pytest.mark.slow
def test_every_segment_of_a_build_has_its_documents_64_bit_hash(tmp_path, byte_tokenizer,
                                                                 monkeypatch, fmt, seq,
                                                                 interrupted):
    """Through a whole `pack build`: each segment's hash is exactly doc_hash of the document
    its first token belongs to, in every row, the final padded row of each split included (at
    seq 8192 val is that one row alone), and after a crash and resume, whose checkpoint carries
    the unfinished row's hashes. concat's: a segment's document is found by its offset in
    the split's stream (best-fit's hashes: test_best_fit.py, against this packing's)."""
    import longpack.pipeline.build as build_mod
    from longpack.pipeline.build import build
    from longpack.pipeline.config import WORK_DIR, BuildConfig
    from longpack.pipeline.formats.shards import open_split

    texts = make_texts(150, seed=5)
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])

    def run():
        build(BuildConfig(out=str(tmp_path / "out"), dataset="jsonl",
                          inputs=(str(tmp_path / "d.jsonl"),), tokenizer=byte_tokenizer,
                          seq=seq, format=fmt, val_fraction=0.1, shard_bytes=seq * 2 * 4,
                          packing="concat"),
              show_progress=False)

    if interrupted:
        monkeypatch.setattr(build_mod, "CHECKPOINT_SECONDS", 0.0)
        monkeypatch.setattr("longpack.pipeline.read.batches.BATCH_CHARS", 2000)
        consume = build_mod.Build._consume
        calls = []

        def crash_at_the_fourth_batch(self, *args):
            calls.append(1)
            if len(calls) == 4:
                raise Crash
            return consume(self, *args)

        with monkeypatch.context() as mp:
            mp.setattr(build_mod.Build, "_consume", crash_at_the_fourth_batch)
            with pytest.raises(Crash):
                run()
        assert (tmp_path / "out" / WORK_DIR / "checkpoint.npz").exists()
    run()
    splitter = Splitter(0.1, seed=0)
    for split in ("train", "val"):
        docs = [t for t in texts if splitter.is_val(doc_hash(t)) == (split == "val")]
        want = [doc_hash(t) for t in docs]
        assert sum(h >= 2**53 for h in want) > len(want) // 2  # they need all 64 bits
        ends = np.cumsum([len(t.encode()) + 1 for t in docs])  # byte tokenizer: 1 token a byte
        owners, got, rows = [], [], 0
        for r, (_, starts, hashes) in enumerate(open_split(tmp_path / "out" / split).rows()):
            rows += 1
            for start, h in zip(starts.tolist(), hashes.tolist()):
                pos = r * seq + start
                if h == PAD_HASH:
                    assert pos == ends[-1]
                    continue
                owners.append(int(np.searchsorted(ends, pos, side="right")))
                got.append(h)
        assert got == [want[o] for o in owners] and set(owners) == set(range(len(docs)))
        if seq == 8192 and split == "val":
            assert rows == 1
