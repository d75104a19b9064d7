"""tools/bench_packing.py (issue 53's concat / best-fit benchmark), run here so it cannot rot
unrun: its own memmap parser on shards written by hand from docs/FORMAT.md, with the damage it
must notice, and the whole tool on a tiny corpus."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import write_byte_ranks

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import bench_packing  # noqa: E402

SEQ, EOS = 8, 9
A, C, B, D = [1, 2, 1, 2, 9], [6, 6, 6, 6, 6, 9], [3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 9], [7, 7, 9]
HASH = {"A": 11, "B": 22, "C": 33, "D": 44}
# The four documents in the order A C B D, rows of 8, as concat lays them: C, B and D are cut.
CONCAT = ([A + C[:3], C[3:] + B[:5], B[5:] + D[:2], D[2:] + [EOS] * 7],
          [(0, 0, "A"), (0, 5, "C"), (1, 0, "C"), (1, 3, "B"), (2, 0, "B"), (2, 6, "D"),
           (3, 0, "D"), (3, 1, None)])
# The same documents as best-fit lays them: only B, longer than a row, is cut.
BEST_FIT = ([B[:8], B[8:] + A, C + [EOS] * 2, D + [EOS] * 5],
            [(0, 0, "B"), (1, 0, "B"), (1, 3, "A"), (2, 0, "C"), (2, 6, None), (3, 0, "D"),
             (3, 3, None)])


def write_build(out: Path, layout, rows_per_shard: int = 3) -> Path:
    """A memmap build as docs/FORMAT.md lays it out (the manifest's keys the parser reads)."""
    rows, segments = layout
    split = out / "train"
    split.mkdir(parents=True)
    shards = []
    for first in range(0, len(rows), rows_per_shard):
        tokens = np.array(rows[first:first + rows_per_shard], dtype=np.uint16)
        segs = np.array([(r - first, start, HASH[h] if h else 0) for r, start, h in segments
                         if first <= r < first + rows_per_shard], dtype=np.uint64)
        entry = {"rows": len(tokens), "segments": len(segs)}
        for part, array in (("tokens", tokens), ("docs", segs)):
            path = split / f"shard.{len(shards):05d}.{part}.npy"
            np.save(path, array)
            entry[part] = {"basename": path.name, "bytes": path.stat().st_size,
                           "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        shards.append(entry)
    (split / "index.json").write_text(json.dumps({
        "format": "longpack-memmap", "version": 1, "seq": SEQ, "dtype": "uint16",
        "rows": len(rows), "shards": shards}))
    padding = sum(SEQ - start for _, start, h in segments if h is None)
    (out / "manifest.json").write_text(json.dumps({
        "seq": SEQ, "pad_id": EOS, "counts": {"tokens": 25, "documents": 4},
        "splits": {"train": {"rows": len(rows), "padding_tokens": padding},
                   "val": {"rows": 0, "padding_tokens": 0}}}))
    return out


def test_the_parser_reads_both_packings_and_finds_every_document_once(tmp_path):
    concat = bench_packing.parse_build(write_build(tmp_path / "concat", CONCAT))
    best_fit = bench_packing.parse_build(write_build(tmp_path / "best-fit", BEST_FIT))
    assert concat.problems == [] and best_fit.problems == []
    c, b = concat.figures(), best_fit.figures()
    assert (c["rows"], c["real_tokens"], c["padding_tokens"]) == (4, 25, 7)
    assert c["split_documents"] == 3 and c["split_share"] == pytest.approx(20 / 25)
    assert b["split_documents"] == 1 and b["split_share"] == pytest.approx(11 / 25)
    assert c["floor_share"] == b["floor_share"] == pytest.approx(11 / 25)
    assert b["padding_share"] == pytest.approx(7 / 32)
    assert sorted(d[:2] for d in concat.docs) == sorted(d[:2] for d in best_fit.docs) == [
        (11, 5), (22, 11), (33, 6), (44, 3)]
    assert ({d[:3] for d in concat.docs} == {d[:3] for d in best_fit.docs})


@pytest.mark.parametrize("damage, problem", [
    ("token", None),  # a changed token: no format problem, but another document
    ("hash", "does not go on here with its hash"),
    ("eos", "EOS inside a segment"),
    ("file", "differs from index.json"),
    ("drop", "the manifest says"),
])
def test_the_parser_notices_damage(tmp_path, damage, problem):
    rows, segments = [list(r) for r in BEST_FIT[0]], list(BEST_FIT[1])
    if damage == "token":
        rows[1][4] = 3
    elif damage == "hash":
        segments[1] = (1, 0, "A")
    elif damage == "eos":
        rows[0][2] = EOS
    elif damage == "drop":  # D is gone: its row is padding
        rows[3], segments[5:] = [EOS] * SEQ, [(3, 0, None)]
    out = write_build(tmp_path / "damaged", (rows, segments))
    if damage == "file":
        path = out / "train" / "shard.00000.tokens.npy"
        data = bytearray(path.read_bytes())
        data[-1] ^= 1
        path.write_bytes(bytes(data))
    parsed = bench_packing.parse_build(out)
    concat = bench_packing.parse_build(write_build(tmp_path / "concat", CONCAT))
    if problem is None:
        assert parsed.problems == []
    else:
        assert any(problem in line for line in parsed.problems), parsed.problems
    same = ({d[:3] for d in parsed.docs} == {d[:3] for d in concat.docs}
            and len(parsed.docs) == len(concat.docs))
    assert not (same and parsed.problems == [])


@pytest.mark.slow
def test_the_tool_on_a_tiny_corpus(tmp_path):
    """Two seqs, both packings, once each: every check passes, best-fit cuts only documents
    longer than a row, and the 32k lines of issue 53 are printed."""
    texts = [("word " * n + f"#{n}").strip() for n in (3, 9, 17, 40, 2, 70, 11, 5, 26, 1)]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pq.write_table(pa.table({"text": texts, "token_count": [len(t.encode()) for t in texts]}),
                   corpus / "000_00000.parquet")
    tokenizer = write_byte_ranks(tmp_path / "gpt2.tiktoken")
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_packing.py"), "--corpus",
                        str(corpus), "--seqs", "64,32768", "--repeat", "1", "--warmup", "0",
                        "--tokenizer", str(tokenizer), "--work", str(tmp_path / "work"),
                        "--json", str(report), "--copies", "3"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    texts = texts * 3  # --copies 3: the corpus read three times over
    assert "issue 53, done when (at --seq 32768)" in r.stdout
    assert "every document's tokens present once: PASS" in r.stdout
    results = json.loads(report.read_text())["results"]
    assert [x["seq"] for x in results] == [64, 32768]
    for result in results:
        assert all(result["checks"].values()) and "lengths_match_input" in result["checks"]
        c, b = result["packings"]["concat"], result["packings"]["best-fit"]
        assert c["documents"] == b["documents"] == len(texts)
        assert c["real_tokens"] == b["real_tokens"] == sum(len(t.encode()) + 1 for t in texts)
        assert b["split_share"] == b["floor_share"] <= c["split_share"]
    assert results[0]["packings"]["best-fit"]["floor_share"] > 0  # some documents exceed 64
    assert not list((tmp_path / "work").iterdir())  # only what it wrote, removed
