"""pack stats on builds packed both ways (concat, best-fit) and on an import: documents split
across rows, their tokens' share of the real tokens, the floor (documents longer than a row,
which every packing splits) and padding, checked against counts made here from the shard files
themselves (numpy on the memmap .npy files, the MDS bytes parsed by hand: never longpack's
readers) and from the input documents."""

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import zstandard
from click.testing import CliRunner

from conftest import write_byte_ranks, write_jsonl
from longpack.pipeline.build import build
from longpack.pipeline.cli import pack
from longpack.pipeline.config import BuildConfig
from longpack.pipeline.formats.base import ShardBlocks
from longpack.pipeline.pack.best_fit import BestFitPacker
from longpack.pipeline.pack.packer import RowPacker
from longpack.pipeline.stats.digest import digest
from longpack.pipeline.stats.scan import SplitScan
from longpack.pipeline.tokenize.split import Splitter, doc_hash

EOS = 50256
SEQ = 64
FIGURES = ("split_documents", "tokens_in_split_documents", "documents_longer_than_row",
           "tokens_in_documents_longer_than_row", "real_tokens", "padding_tokens")


# -- the shard files read here, by their bytes (FORMAT.md) -------------------------------------

def mds_column(raw: bytes, dtype: str) -> np.ndarray:
    """A variable-shape ndarray column: one byte (1 << 2) | c, the length as uint8/16/32/64 for
    c = 0/1/2/3, then the values."""
    width = 1 << (raw[0] & 3)
    n = int.from_bytes(raw[1:1 + width], "little")
    return np.frombuffer(raw, dtype, n, 1 + width)


def mds_rows(folder: Path, entry: dict):
    zipped = entry.get("zip_data")
    data = (zstandard.ZstdDecompressor().decompress((folder / zipped["basename"]).read_bytes())
            if zipped else (folder / entry["raw_data"]["basename"]).read_bytes())
    n = struct.unpack_from("<I", data)[0]
    offsets = np.frombuffer(data, "<u4", n + 1, 4)
    dtype = "<" + np.dtype(entry["column_encodings"][2].split(":")[1]).str[1:]
    for i in range(n):
        sample = data[offsets[i]:offsets[i + 1]]
        size_h, size_s = struct.unpack_from("<II", sample)
        hashes = mds_column(sample[8:8 + size_h], "<u8")
        starts = mds_column(sample[8 + size_h:8 + size_h + size_s], "<u4")
        yield (np.frombuffer(sample[8 + size_h + size_s:], dtype),
               list(zip(starts.tolist(), hashes.tolist())))


def shard_rows(folder: Path):
    """(tokens, [(start, hash), ...]) of each row of a split, in order."""
    for entry in json.loads((folder / "index.json").read_text())["shards"]:
        if "docs" in entry:  # memmap: [rows, seq] tokens, [segments, 3] (row, start, hash)
            tokens = np.load(folder / entry["tokens"]["basename"])
            docs = np.load(folder / entry["docs"]["basename"])
            for r in range(len(tokens)):
                yield tokens[r], [(int(s), int(h)) for _, s, h in docs[docs[:, 0] == r]]
        else:
            yield from mds_rows(folder, entry)


def count(folder: Path) -> dict:
    """Documents as pieces chained row to row: a row's first segment continues the previous
    row's last document when that row ends neither in padding nor in EOS (and then carries that
    document's hash); every other segment but padding (hash 0, a row's last) opens one."""
    docs, padding, before = [], 0, None  # before: (last token, padded, last real hash)
    for tokens, segments in shard_rows(folder):
        ends = [s for s, _ in segments[1:]] + [len(tokens)]
        for k, ((start, h), end) in enumerate(zip(segments, ends)):
            if h == 0:
                assert k == len(segments) - 1 and end == len(tokens)
                padding += end - start
            elif k == 0 and before is not None and not before[1] and before[0] != EOS:
                assert h == before[2]
                docs[-1][0] += end - start
                docs[-1][1] += 1
            else:
                docs.append([end - start, 1])
        padded = segments[-1][1] == 0
        before = (int(tokens[-1]), padded, None if padded else segments[-1][1])
    lengths, rows = (np.array([d[i] for d in docs], np.int64) for i in (0, 1))
    split, long = rows > 1, lengths > SEQ
    return {"split_documents": int(split.sum()),
            "tokens_in_split_documents": int(lengths[split].sum()),
            "documents_longer_than_row": int(long.sum()),
            "tokens_in_documents_longer_than_row": int(lengths[long].sum()),
            "real_tokens": int(lengths.sum()), "padding_tokens": padding}


# -- the corpus --------------------------------------------------------------------------------

def lengths_of(n: int, rng) -> np.ndarray:
    """Mostly documents shorter than a row (concat cuts those at row ends, best-fit never),
    some of one to several rows (every packing cuts them), a few of exactly a row."""
    lengths = np.where(rng.random(n) < 0.8, rng.integers(2, 50, n), rng.integers(60, 300, n))
    lengths[::37] = SEQ
    return lengths


def corpus() -> list[str]:
    """One byte per token: a document of L tokens (its EOS included) is a text of L - 1 bytes,
    no two alike (identical texts are one document hash)."""
    rng = np.random.default_rng(3)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    texts = []
    for k in lengths_of(300, rng):
        text = "".join(rng.choice(letters, k - 1))
        while text in texts:
            text = "".join(rng.choice(letters, k - 1))
        texts.append(text)
    return texts


def text_floor(texts: list[str], split: str) -> int:
    s = Splitter(0.2, 0)
    lengths = np.array([len(t.encode()) + 1 for t in texts
                        if s.is_val(doc_hash(t.encode())) == (split == "val")])
    return int(lengths[lengths > SEQ].sum())


def stats_json(out: Path) -> dict:
    r = CliRunner().invoke(pack, ["stats", str(out), "--json", "--verify"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


@pytest.mark.parametrize("fmt", ["memmap", "mds"])
@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_split_share_and_floor_match_a_count_from_the_shard_files(tmp_path, packing, fmt):
    texts = corpus()
    assert len(set(texts)) == len(texts)
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    out = tmp_path / "out"
    build(BuildConfig(out=str(out), dataset="jsonl", inputs=(str(src),),
                      tokenizer=str(write_byte_ranks(tmp_path / "gpt2.tiktoken")), seq=SEQ,
                      format=fmt, val_fraction=0.2, shard_bytes=SEQ * 2 * 16, packing=packing),
          show_progress=False)
    r = stats_json(out)
    assert r["checks"]["ok"], r["checks"]["problems"]
    for split in ("train", "val"):
        got, want = r["splits"][split], count(out / split)
        assert {k: got[k] for k in FIGURES} == want
        share = want["tokens_in_split_documents"] / want["real_tokens"]
        assert abs(100 * got["split_share"] - 100 * share) <= 0.5
        assert got["split_share"] == pytest.approx(share, abs=1e-12)
        assert got["tokens_in_documents_longer_than_row"] == text_floor(texts, split)
        assert got["padding_share"] == pytest.approx(want["padding_tokens"] / got["tokens"])
        if packing == "best-fit":  # nothing that fits a row is cut: the floor exactly
            assert got["split_share"] == got["split_share_floor"]
            assert got["split_documents"] == got["documents_longer_than_row"]
        else:  # concat cuts short documents at row ends too
            assert got["split_share"] > got["split_share_floor"] + 0.05
    total = r["total"]
    assert total["tokens_in_split_documents"] == sum(
        r["splits"][s]["tokens_in_split_documents"] for s in ("train", "val"))
    assert total["split_share"] == pytest.approx(
        total["tokens_in_split_documents"] / total["real_tokens"])
    text = CliRunner().invoke(pack, ["stats", str(out)]).output
    train = r["splits"]["train"]
    assert (f"split across rows {train['split_documents']:,} "
            f"({100 * train['split_share']:.1f}%)") in " ".join(text.split())


@pytest.mark.parametrize("fmt", ["memmap", "mds"])
def test_an_imports_split_share_and_floor_match_a_count_from_the_shard_files(tmp_path,
                                                                            byte_tokenizer, fmt):
    """An import re-packs another tool's token stream as concat does; its stream's last piece,
    cut off without its EOS, is a document too (and here one longer than a row)."""
    rng = np.random.default_rng(5)
    lengths = lengths_of(300, rng)
    lengths[-1] = 150 + int((lengths[:-1].sum() + 150) % SEQ == 0)  # the cut is inside it
    stream = np.concatenate([np.append(rng.integers(0, 256, k - 1), EOS) for k in lengths])
    rows = len(stream) // SEQ
    assert stream[rows * SEQ - 1] != EOS
    (tmp_path / "src").mkdir()
    np.save(tmp_path / "src" / "tokens.npy", stream[:rows * SEQ].astype(np.uint16)
            .reshape(rows, SEQ))
    out = tmp_path / "out"
    r = CliRunner().invoke(pack, ["import", str(tmp_path / "src"), "--out", str(out),
                                  "--eos-id", str(EOS), "--tokenizer", byte_tokenizer,
                                  "--format", fmt, "--val-fraction", "0.2",
                                  "--shard-bytes", str(SEQ * 2 * 16), "--quiet"])
    assert r.exit_code == 0, r.output
    r = stats_json(out)
    pieces = np.diff(np.concatenate([[-1], np.flatnonzero(stream[:rows * SEQ] == EOS),
                                     [rows * SEQ - 1]]))
    for split in ("train", "val"):
        got, want = r["splits"][split], count(out / split)
        assert {k: got[k] for k in FIGURES} == want
        assert got["split_share"] > got["split_share_floor"] > 0
    assert r["total"]["tokens_in_documents_longer_than_row"] == pieces[pieces > SEQ].sum()


# -- the scan alone, on rows the packers make (quick) -----------------------------------------

VOCAB, END = 300, 299


def packed(packing: str, lengths: np.ndarray, seq: int, rng):
    """The rows and segments the build's packers make of documents of these lengths."""
    tokens = np.concatenate([np.append(rng.integers(0, END, k - 1), END) for k in lengths])
    hashes = np.arange(1, len(lengths) + 1, dtype=np.uint64)
    if packing == "concat":
        packer = RowPacker(seq, np.uint16)
        rows, segments = packer.add(tokens, lengths, hashes)
        last, last_segments, padding, _ = packer.finish("pad", END)
    else:
        packer = BestFitPacker(seq, np.uint16, END, window_rows=4)  # several windows
        rows, segments = packer.add(tokens, lengths, hashes)
        last, last_segments, padding, _ = packer.finish("pad", END)
    last_segments[:, 0] += np.uint64(len(rows))
    return (np.concatenate([rows, last]), np.concatenate([segments, last_segments]), padding)


def scan_shards(rows, segments, seq: int, shard_rows: int, problems: list) -> SplitScan:
    scan = SplitScan("train", END, VOCAB, True, problems, seq=seq)
    for a in range(0, len(rows), shard_rows):
        part = rows[a:a + shard_rows]
        mine = segments[(segments[:, 0] >= a) & (segments[:, 0] < a + len(part))].copy()
        mine[:, 0] -= np.uint64(a)
        shard = ShardBlocks(Path(f"shard.{a:05d}"), len(part), seq, part.dtype, mine,
                            iter([(r, part[r:r + 2]) for r in range(0, len(part), 2)]))
        scan.add(shard, digest(shard, END, 1, VOCAB))
    return scan


@pytest.mark.parametrize("shard_rows", [1, 3, 16])
@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_split_figures_across_shards_are_those_of_the_documents(packing, shard_rows):
    """Shards of any size (a document over many of them): split documents and their tokens are
    those whose tokens sit in two or more rows, computed from the documents' positions alone;
    under best-fit exactly the floor. --verify's checks pass on every row of either packing."""
    seq = 32
    rng = np.random.default_rng(shard_rows)
    lengths = np.where(rng.random(200) < 0.7, rng.integers(1, 40, 200), rng.integers(41, 200, 200))
    lengths[::23] = seq
    lengths[5::41] = 2 * seq
    rows, segments, padding = packed(packing, lengths, seq, rng)
    problems = []
    scan = scan_shards(rows, segments, seq, shard_rows, problems)
    long = lengths > seq
    if packing == "concat":
        starts = np.cumsum(lengths) - lengths
        split = starts // seq != (starts + lengths - 1) // seq
    else:
        split = long
    assert problems == []
    assert scan.split_figures() == (split.sum(), lengths[split].sum(), long.sum(),
                                    lengths[long].sum())
    assert scan.padding == padding and scan.documents == len(lengths)
    assert scan.lengths.summary()["max"] == lengths.max()
    if packing == "best-fit":  # padding in many rows, not only the last
        assert len(np.unique(segments[segments[:, 2] == 0, 0])) > 5


def test_verify_names_padding_that_is_not_a_rows_end_or_not_the_pad_id():
    seq = 32
    rng = np.random.default_rng(0)
    rows, segments, _ = packed("best-fit", rng.integers(1, 30, 60), seq, rng)
    at = next(i for i in np.flatnonzero(segments[:, 2] == 0) if segments[i, 1] < seq - 1)
    r = int(segments[at, 0])  # a row of 2 or more pad tokens
    rows[r, -1] = 7  # a pad token that is not the pad id
    problems = []
    scan_shards(rows, segments, seq, len(rows), problems)
    assert [(p.row, p.what) for p in problems] == [
        (r, f"the row's padding holds ids other than the pad id {END}")]
    rows[r, -1] = END
    segments = np.insert(segments, at + 1, [r, seq - 1, 12345], axis=0)  # a segment after it
    problems = []
    scan_shards(rows, segments, seq, len(rows), problems)
    assert (r, "a padding segment (hash 0) is followed by another segment in its row "
               "(padding ends a row)") in [(p.row, p.what) for p in problems]


@pytest.mark.parametrize("pad_id", [END, 0])  # the pad id EOS (FORMAT.md), or damage
@pytest.mark.parametrize("real_eos", [True, False])  # False: the largest id only in padding
@pytest.mark.parametrize("count_every", [1, 3])
@pytest.mark.parametrize("block_rows", [1, 2, 5])
def test_digest_of_rows_ending_in_padding_is_that_of_their_real_tokens(pad_id, real_eos,
                                                                       count_every, block_rows):
    """Padding at the end of many rows, rows of real tokens with and without EOS, rows all
    real: id range, EOS positions and counts are the real tokens'."""
    rng = np.random.default_rng(block_rows)
    n, seq = 9, 16
    tokens = rng.integers(10, 50, (n, seq)).astype(np.uint16)
    if real_eos:
        tokens[rng.random((n, seq)) < 0.1] = END
    real_len = [16, 5, 12, 1, 16, 9, 3, 16, 7]
    segments = []
    for r, k in enumerate(real_len):
        segments.append([r, 0, 100 + r])
        if k < seq:
            tokens[r, k:] = pad_id
            segments.append([r, k, 0])
    tokens[3, 0] = 11  # a row whose only real token is not EOS
    real = np.concatenate([tokens[r, :k] for r, k in enumerate(real_len)])
    blocks = ((a, tokens[a:a + block_rows].copy()) for a in range(0, n, block_rows))
    d = digest(ShardBlocks(Path("s"), n, seq, tokens.dtype, np.array(segments, np.uint64),
                           blocks), END, count_every, vocab_size=VOCAB)
    flat_at = [r * seq + np.flatnonzero(tokens[r, :k] == END) for r, k in enumerate(real_len)]
    counted = np.concatenate([tokens[r, :real_len[r]] for r in range(0, n, count_every)])
    assert d.real == len(real) and (d.lo, d.hi) == (real.min(), real.max())
    assert np.array_equal(d.eos, np.concatenate(flat_at))
    assert np.array_equal(np.trim_zeros(d.counts, "b"), np.bincount(counted))
    assert d.pad_not_eos_row == (None if pad_id == END else 1)
