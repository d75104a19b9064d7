import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.pack import RowPacker
from pipeline.split import PAD_HASH, Splitter, doc_hash

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
    import pytest

    assert doc_hash("δέλτα") == doc_hash("δέλτα".encode())
    with pytest.raises(UnicodeEncodeError):
        doc_hash("a\ud800")
