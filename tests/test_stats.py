"""pack stats on small built fixtures: figures against an independent computation, every
validation failure class produced on purpose, and the JSON keys."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import make_texts, write_byte_ranks, write_jsonl
from longpack.pipeline.build import build
from longpack.pipeline.cli import pack
from longpack.pipeline.config import BuildConfig
from longpack.pipeline.stats.report import collect
from longpack.pipeline.stats.scan import find_rare
from longpack.pipeline.tokenize.split import Splitter, doc_hash

EOS = 50256
SEQ = 64


@pytest.fixture
def texts():
    return make_texts(400, seed=7)


@pytest.fixture(scope="module", autouse=True)
def _builds_made_once(tmp_path_factory):
    """Where make_build keeps the one build of each (texts, format, settings) of the module."""
    _BUILT["folder"] = tmp_path_factory.mktemp("stats-builds")
    yield
    _BUILT.clear()


_BUILT: dict = {}


def make_build(tmp_path, texts, fmt="mds", name="out", **kw):
    """tmp_path/name: this test's copy of the build of `texts` (tests damage their copy); each
    (texts, format, settings) is built once for the module (a build ~1 s, a copy ~10 ms).
    Packed concat unless asked otherwise: `expected` computes concat's rows, and the damage
    below needs rows that continue a document (best-fit builds: test_stats_packing.py)."""
    kw.setdefault("packing", "concat")
    key = repr((texts, fmt, sorted(kw.items())))
    if key not in _BUILT:
        at = _BUILT["folder"] / str(len(_BUILT))
        src = at / "src"
        src.mkdir(parents=True)
        write_jsonl(src / "d.jsonl", [{"text": t} for t in texts])
        build(BuildConfig(out=str(at / "out"), dataset="jsonl", inputs=(str(src / "d.jsonl"),),
                          tokenizer=str(write_byte_ranks(at / "gpt2.tiktoken")), seq=SEQ,
                          format=fmt, val_fraction=0.2, shard_bytes=SEQ * 2 * 16, **kw),
              show_progress=False)
        _BUILT[key] = at / "out"
    return Path(shutil.copytree(_BUILT[key], tmp_path / name))


def expected(texts, split):
    """Figures computed from the input texts alone (byte tokenizer: one token per byte)."""
    s = Splitter(0.2, 0)
    docs = [t for t in texts if s.is_val(doc_hash(t.encode())) == (split == "val")]
    lengths = np.array([len(t.encode()) + 1 for t in docs])
    tokens = int(lengths.sum())
    rows = -(-tokens // SEQ)
    ids = np.concatenate([np.frombuffer(t.encode(), np.uint8) for t in docs]).astype(np.int64)
    ends = np.cumsum(lengths)  # a document starts inside a row unless it starts at a row start
    boundary_rows = {int(e // SEQ) for e in ends[:-1] if e % SEQ}
    return {"documents": len(docs), "real_tokens": tokens, "rows": rows,
            "padding_tokens": rows * SEQ - tokens, "lengths": lengths, "ids": ids,
            "boundary_rows": len(boundary_rows)}


@pytest.mark.parametrize("fmt", ["mds", "memmap"])
@pytest.mark.slow
def test_figures_match_an_independent_computation(tmp_path, byte_tokenizer, texts, fmt):
    out = make_build(tmp_path, texts, fmt)
    r = collect(out, verify=True)
    assert r["checks"]["ok"], r["checks"]["problems"]
    for split in ("train", "val"):
        got, want = r["splits"][split], expected(texts, split)
        for key in ("documents", "real_tokens", "rows", "padding_tokens"):
            assert got[key] == want[key], key
        assert got["tokens"] == want["rows"] * SEQ and got["seq"] == SEQ
        d = got["doc_length"]
        lengths = want["lengths"]
        assert d["count"] == len(lengths) and d["max"] == lengths.max()
        assert d["mean"] == pytest.approx(lengths.mean())
        srt = np.sort(lengths)
        for q, key in ((0.5, "median"), (0.1, "p10"), (0.9, "p90"), (0.99, "p99")):
            assert d[key] == srt[min(int(q * len(srt)), len(srt) - 1)]
        assert sum(d["histogram"]["counts"]) == len(lengths)
        assert got["rows_with_boundary_fraction"] == pytest.approx(
            want["boundary_rows"] / want["rows"])
        v = got["vocab"]
        ids = np.concatenate([want["ids"], [EOS]])
        assert (v["min_id"], v["max_id"]) == (ids.min(), ids.max())
        assert v["distinct_ids"] == len(np.unique(ids))
        counts = np.bincount(np.concatenate([want["ids"], np.full(want["documents"], EOS)]))
        assert v["top"][0]["id"] == int(np.argmax(counts))
        assert v["top"][0]["count"] == counts.max()
        assert got["bytes_on_disk"] == sum(p.stat().st_size for p in (out / split).iterdir())
    assert r["total"]["rows"] == r["splits"]["train"]["rows"] + r["splits"]["val"]["rows"]


def test_without_verify_token_counts_come_from_every_8th_row(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts, "memmap")
    rows = np.concatenate([np.load(p) for p in sorted((out / "train").glob("*.tokens.npy"))])
    fast = collect(out)["splits"]["train"]["vocab"]
    shard_rows = SEQ * 2 * 16 // (SEQ * 2)  # rows per shard of make_build
    sampled = np.concatenate([rows[i:i + shard_rows][::8] for i in range(0, len(rows), shard_rows)])
    counts = np.bincount(sampled.reshape(-1)[: sampled.size - (
        expected(texts, "train")["padding_tokens"] if (len(rows) - 1) % shard_rows % 8 == 0
        else 0)])
    assert fast["top"][0]["count"] == counts.max() and fast["distinct_ids"] == (counts > 0).sum()
    assert fast["counted_fraction"] == counts.sum() / expected(texts, "train")["real_tokens"]
    assert (fast["min_id"], fast["max_id"]) == (10, EOS)  # the id range uses every token


@pytest.mark.slow
def test_recommendations_follow_from_the_train_tokens(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts)
    r = collect(out, throughput=1000.0, budget=1e6)["recommendations"]
    train = expected(texts, "train")["real_tokens"]
    assert r["compute_optimal_params"] == train / 20
    assert r["epochs_for_budget"] == pytest.approx(1e6 / train)
    assert r["epoch_seconds"] == pytest.approx(train / 1000)
    assert r["budget_seconds"] == pytest.approx(1000)
    assert r["vocab_size"] == 50257  # presets are sized at the build's vocabulary
    assert "presets near it, at vocab 50,257: " in run_stats(out).output


def run_stats(path, *args):
    return CliRunner().invoke(pack, ["stats", str(path), *args])


def first_shard(out, split="train", suffix=".mds.zstd"):
    return sorted((out / split).glob(f"shard.*{suffix}"))[0]


def test_recommended_presets_come_from_the_zoo():
    from longpack.pipeline.stats.recommend import recommendations

    tiny = 165_632  # neox-tiny's parameters (archs/presets.json)
    presets = recommendations(20 * tiny, None, None)["presets"]
    assert "neox-tiny" in [p["name"] for p in presets]
    assert all(0.5 * tiny <= p["params"] <= 2 * tiny for p in presets)
    assert recommendations(20 * 10**15, None, None)["presets"] == []


def test_sound_build_exits_0_and_prints_one_screen(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts)
    r = run_stats(out, "--verify")
    assert r.exit_code == 0, r.output
    assert "checks                OK" in r.output and len(r.output.splitlines()) <= 40


def test_truncated_shard(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts)
    shard = first_shard(out)
    shard.write_bytes(shard.read_bytes()[:-100])
    r = run_stats(out)
    assert r.exit_code == 1
    assert f"train/{shard.name}: truncated" in r.output and "--overwrite" in r.output


def test_flipped_byte_is_a_checksum_mismatch_under_verify(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts, fmt="memmap")
    shard = first_shard(out, suffix=".tokens.npy")
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0x01
    shard.write_bytes(bytes(data))
    assert run_stats(out).exit_code == 0  # same size: only --verify can tell
    r = run_stats(out, "--verify")
    assert r.exit_code == 1 and f"train/{shard.name}: checksum mismatch" in r.output


def rewrite_memmap_tokens(shard, change):
    tokens = np.load(shard)
    change(tokens)
    np.save(shard, tokens)
    index = json.loads((shard.parent / "index.json").read_text())
    for s in index["shards"]:  # keep sizes and checksums right: only the content is wrong
        if s["tokens"]["basename"] == shard.name:
            import hashlib
            s["tokens"]["bytes"] = shard.stat().st_size
            s["tokens"]["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    (shard.parent / "index.json").write_text(json.dumps(index))


def test_out_of_range_token_id(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts, fmt="memmap")
    shard = first_shard(out, suffix=".tokens.npy")
    rewrite_memmap_tokens(shard, lambda t: t.__setitem__((3, 5), 60000))
    r = run_stats(out, "--verify")
    assert r.exit_code == 1
    assert f"train/{shard.name}, row 3: token id 60000 >= vocab size 50257" in r.output


def test_moved_eos_disagrees_with_document_starts(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts, fmt="memmap")
    shard = first_shard(out, suffix=".tokens.npy")

    def drop_an_eos(t):
        r, c = np.argwhere(t[:, :-1] == EOS)[0]
        t[r, c] = ord("x")

    rewrite_memmap_tokens(shard, drop_an_eos)
    r = run_stats(out, "--verify")
    assert r.exit_code == 1 and "document starts do not match the EOS positions" in r.output


def rewrite_memmap_docs(path, change):
    """Edit a memmap shard's segments, keeping its size and checksum in index.json right."""
    import hashlib

    docs = np.load(path)
    change(docs)
    np.save(path, docs)
    index = json.loads((path.parent / "index.json").read_text())
    for s in index["shards"]:
        if s["docs"]["basename"] == path.name:
            s["docs"]["bytes"] = path.stat().st_size
            s["docs"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (path.parent / "index.json").write_text(json.dumps(index))


def continued_rows(tokens: np.ndarray, before: int | None) -> list[int]:
    """Rows of a shard that open with the rest of a document (the token before is not EOS)."""
    last = [before] + tokens[:-1, -1].tolist()
    return [r for r in range(len(tokens)) if last[r] is not None and last[r] != EOS]


@pytest.mark.parametrize("across_shards", [False, True])
@pytest.mark.slow
def test_a_continued_row_with_another_documents_hash_fails_verify(tmp_path, byte_tokenizer,
                                                                  texts, across_shards):
    """A row that opens with a continuation must carry the hash of the previous row's last
    document, also when that row is the previous shard's last."""
    out = make_build(tmp_path, texts, fmt="memmap")
    tokens = sorted((out / "train").glob("*.tokens.npy"))
    docs_files = sorted((out / "train").glob("*.docs.npy"))
    shard = 1 if across_shards else 0
    before = int(np.load(tokens[0])[-1, -1]) if across_shards else None
    rows = continued_rows(np.load(tokens[shard]), before)
    row = 0 if across_shards else rows[0]
    assert row in rows and (row == 0) == across_shards
    docs = np.load(docs_files[shard])
    opening = np.flatnonzero((docs[:, 0] == row) & (docs[:, 1] == 0))[0]
    right = int(docs[opening, 2])
    wrong = int(docs[docs[:, 1] != 0][-1, 2])  # another document of the same shard
    rewrite_memmap_docs(docs_files[shard], lambda d: d.__setitem__((opening, 2), wrong))
    assert run_stats(out).exit_code == 0  # the default checks do not look at continuations
    r = run_stats(out, "--verify")
    assert r.exit_code == 1
    before_row = "the previous shard's last row" if across_shards else f"row {row - 1}"
    assert (f"train/{tokens[shard].name}, row {row}: the row continues the last document of "
            f"{before_row} ({right:016x}) but its first segment's hash is {wrong:016x}"
            in r.output), r.output
    assert "1 PROBLEMS" in r.output


def test_the_shard_after_an_unreadable_one_is_not_checked_against_the_shard_before(
        tmp_path, byte_tokenizer, texts):
    """Its first row's predecessor is unknown: no continuation problem is made up."""
    out = make_build(tmp_path, texts, fmt="memmap")
    tokens = sorted((out / "train").glob("*.tokens.npy"))
    assert continued_rows(np.load(tokens[2]), int(np.load(tokens[1])[-1, -1]))[0] == 0
    tokens[1].write_bytes(tokens[1].read_bytes()[:-100])
    problems = collect(out, verify=True)["checks"]["problems"]
    assert [p["file"] for p in problems if p["file"] != "train"] == [f"train/{tokens[1].name}"]


def test_wrong_row_length(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts, fmt="memmap")
    shard = first_shard(out, suffix=".tokens.npy")
    tokens = np.load(shard)
    np.save(shard, tokens[:, :-1])
    r = run_stats(out)
    assert r.exit_code == 1 and f"train/{shard.name}" in r.output
    name = f"train/{shard.name}"  # both the size and the row length are wrong: each is said
    assert f"{name}: truncated ({shard.stat().st_size:,} bytes, index.json says" in r.output
    assert f"{name}: rows of 63 tokens, the split's seq is 64" in r.output


def test_wrong_row_length_in_mds(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts)
    shard = first_shard(out)
    index = json.loads((out / "train" / "index.json").read_text())
    index["shards"][0]["column_encodings"][2] = "ndarray:uint16:32"
    index["shards"][0]["column_sizes"][2] = 64
    (out / "train" / "index.json").write_text(json.dumps(index))
    r = run_stats(out)
    assert r.exit_code == 1 and f"train/{shard.name}" in r.output


def test_missing_shard(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts)
    shard = first_shard(out)
    shard.unlink()
    r = run_stats(out)
    assert r.exit_code == 1 and f"train/{shard.name}: missing" in r.output


def test_overlapping_splits(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts, fmt="memmap")
    # copy train's first shard's document hashes into val's segments
    train_docs = np.load(first_shard(out, suffix=".docs.npy"))
    val_path = first_shard(out, "val", suffix=".docs.npy")
    val_docs = np.load(val_path)
    inner = np.flatnonzero(val_docs[:, 1] != 0)[:2]  # segments that begin a document
    assert len(inner) >= 1
    val_docs[inner, 2] = train_docs[train_docs[:, 1] != 0][: len(inner), 2]
    np.save(val_path, val_docs)
    r = run_stats(out)
    assert r.exit_code == 1 and "documents are in both train and val" in r.output


def test_counts_disagreeing_with_the_manifest(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts)
    m = json.loads((out / "manifest.json").read_text())
    m["splits"]["train"]["documents"] += 1
    (out / "manifest.json").write_text(json.dumps(m))
    r = run_stats(out)
    assert r.exit_code == 1 and "manifest.json says" in r.output


def test_missing_directory_is_one_line(tmp_path):
    r = run_stats(tmp_path / "nope")
    assert r.exit_code == 1 and r.output.strip().count("\n") == 0 and "no such directory" in r.output


def failed_cleanly(r) -> str:
    """The output of a `pack stats` run that exited 1 on purpose (no exception escaped)."""
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.exception
    return r.output


@pytest.mark.parametrize("content,what", [
    (b'{"version": 2, "shards": [', "not valid JSON (Expecting value: line 1 column 27"),
    (b"\xff\xfe", "not valid JSON ("),
    (b"[1, 2]", "has no list of shards: not an MDS or longpack-memmap index"),
    (b'{"shards": [{"samples": 3}]}', "shard 0 of its mds index has no raw_data, zip_data, "
                                      "column_names, column_encodings, column_sizes")])
@pytest.mark.slow
def test_an_index_json_that_cannot_be_used_is_named(tmp_path, byte_tokenizer, texts, content,
                                                    what):
    out = make_build(tmp_path, texts)
    (out / "val" / "index.json").write_bytes(content)
    output = failed_cleanly(run_stats(out))
    problem = next(line for line in output.splitlines() if "val/index.json" in line)
    assert problem.strip().startswith(f"val/index.json: {what}"), problem
    assert str(out) not in problem  # the file once, as the build names it
    assert "train" in json.loads(run_stats(out, "--json").output)["splits"]  # the rest is read
    assert failed_cleanly(run_stats(out, "--decode", "0", "--split", "val")).startswith(
        "Error: ") and "val/index.json" in output


@pytest.mark.parametrize("fmt", ["mds", "memmap"])
@pytest.mark.parametrize("verify", [[], ["--verify"]])
@pytest.mark.slow
def test_a_build_without_its_manifest_is_a_problem_not_a_crash(tmp_path, byte_tokenizer, texts,
                                                               fmt, verify):
    out = make_build(tmp_path, texts, fmt)
    (out / "manifest.json").unlink()
    for path in (out / "train", out):
        output = failed_cleanly(run_stats(path, *verify))
        assert (f"manifest.json: missing from {out}, which holds a build's other outputs (it is "
                "written last); re-run the same pack build command to rebuild it") in output
        assert "1 PROBLEMS" in output
    # with --eos-id the documents are counted as with the manifest
    r = json.loads(run_stats(out / "train", "--eos-id", str(EOS), "--json", *verify).output)
    assert r["splits"]["train"]["documents"] == expected(texts, "train")["documents"]


@pytest.mark.parametrize("holds", [[], ["notes.txt"], ["a", "b.csv"], ["train/", "val/x.txt"]])
def test_a_folder_that_is_no_build_says_what_it_lacks_in_one_line(tmp_path, holds):
    folder = tmp_path / "nothing"
    folder.mkdir()
    for name in holds:
        (folder / name).parent.mkdir(exist_ok=True)
        if name.endswith("/"):
            (folder / name).mkdir()
        else:
            (folder / name).write_text("x")
    output = failed_cleanly(run_stats(folder))
    assert output == (f"Error: {folder}: no manifest.json, no train/ or val/ folder, no "
                      "index.json and no .npy files\n")


def test_a_split_the_manifest_lists_but_is_gone_is_a_problem(tmp_path, byte_tokenizer, texts):
    import shutil

    out = make_build(tmp_path, texts)
    shutil.rmtree(out / "val")
    output = failed_cleanly(run_stats(out))
    assert "val: missing (manifest.json lists this split)" in output
    (out / "val").mkdir()
    output = failed_cleanly(run_stats(out))
    assert "val: no index.json and no .npy files; re-run the same pack build" in output


def test_segments_outside_the_shards_rows_are_a_problem(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts, fmt="memmap")
    docs = sorted((out / "train").glob("*.docs.npy"))[0]
    rewrite_memmap_docs(docs, lambda d: d.__setitem__((-1, 0), 99))
    output = failed_cleanly(run_stats(out))
    tokens = docs.name.replace("docs", "tokens")
    assert f"train/{tokens}: a segment of row 99, the shard has 16 rows" in output


def test_a_manifest_that_is_not_longpacks_is_one_line(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts)
    m = json.loads((out / "manifest.json").read_text())
    del m["tokenizer"]["eos_id"], m["splits"]["val"]["rows"]
    (out / "manifest.json").write_text(json.dumps(m))
    output = failed_cleanly(run_stats(out))
    assert output == (f"Error: {out}/manifest.json: not a longpack manifest (no tokenizer.eos_id, "
                      "splits.val.rows); re-run the pack build that wrote it\n")


def test_json_keys_are_stable(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts)
    r = json.loads(run_stats(out, "--json").output)
    assert set(r) == {"path", "format", "tokenizer", "splits", "total", "checks",
                      "recommendations"}
    assert set(r["splits"]["train"]) == {
        "shards", "rows", "seq", "dtype", "bytes_on_disk", "raw_bytes", "compression_ratio",
        "bytes_per_token", "tokens", "real_tokens", "padding_tokens", "padding_share",
        "documents", "documents_per_row", "rows_with_boundary_fraction", "doc_length", "vocab",
        "split_documents", "tokens_in_split_documents", "split_share",
        "documents_longer_than_row", "tokens_in_documents_longer_than_row", "split_share_floor"}
    assert set(r["splits"]["train"]["doc_length"]) == {
        "count", "mean", "median", "p10", "p90", "p99", "max", "histogram"}
    assert set(r["splits"]["train"]["vocab"]) == {"min_id", "max_id", "distinct_ids",
                                                  "counted_fraction", "rank_fractions", "top"}
    assert set(r["checks"]) == {"verified", "ok", "problems", "not_checked"}


def test_decode_marks_document_boundaries(tmp_path, byte_tokenizer, texts):
    from longpack.pipeline.formats.shards import open_split

    out = make_build(tmp_path, texts)
    rows = list(open_split(out / "train").rows())
    # a row after one that ends in EOS opens with a new document; after any other, a continued one
    fresh = next(r for r in range(1, len(rows)) if rows[r - 1][0][-1] == EOS)
    continued = next(r for r in range(1, len(rows)) if rows[r - 1][0][-1] != EOS)
    for row, label in ((fresh, "⟦document"), (continued, "⟦continued document")):
        r = run_stats(out, "--decode", str(row))
        assert r.exit_code == 0 and r.output.startswith(f"train row {row}: 64 tokens")
        first = r.output.splitlines()[2]
        assert first.startswith(label), (row, first)
        assert r.output.count("⟦") == len(rows[row][1])  # a marker per segment
    assert run_stats(out, "--decode", "99999").exit_code == 1


@pytest.mark.slow
def test_plot_writes_a_png(tmp_path, byte_tokenizer, texts):
    pytest.importorskip("matplotlib")
    out = make_build(tmp_path, texts)
    assert run_stats(out, "--plot", str(tmp_path / "p.png")).exit_code == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("flags, says", [
    (["--decode", "-1"], "--decode must be at least 0 (got -1)"),
    (["--throughput", "-5"], "--throughput must be positive and finite (got -5.0)"),
    (["--throughput", "0"], "--throughput must be positive and finite (got 0.0)"),
    (["--budget", "-1"], "--budget must be positive and finite (got -1.0)"),
    (["--budget", "nan"], "--budget must be positive and finite (got nan)"),
    (["--eos-id", "-3"], "--eos-id must be at least 0 (got -3)"),
    (["--plot", "{tmp}/no/such/folder/p.png"], "there is no folder {tmp}/no/such/folder"),
    (["--plot", "{tmp}"], "is a folder; name the PNG file"),
])
def test_bad_flags_are_one_line_before_anything_is_read(tmp_path, flags, says):
    """Refused by StatsConfig, before the build is opened: the path need not exist."""
    flags = [f.format(tmp=tmp_path) for f in flags]
    r = run_stats(tmp_path / "no-build", *flags)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), r.output
    assert says.format(tmp=tmp_path) in lines[0]
    assert not list(tmp_path.rglob("*.png"))


def test_plain_npy_directory_is_read_and_says_what_it_could_not_check(tmp_path):
    rows = np.array([[1, 2, EOS, 3], [4, EOS, 5, EOS]], np.uint16)
    (tmp_path / "data").mkdir()
    np.save(tmp_path / "data" / "part0.npy", rows)
    r = collect(tmp_path / "data", eos_id=EOS)
    s = r["splits"]["data"]
    assert (s["rows"], s["documents"], s["seq"]) == (2, 3, 4)
    assert s["doc_length"]["max"] == 3 and r["checks"]["ok"]
    assert any("manifest.json absent" in n for n in r["checks"]["not_checked"])


def test_other_tools_mds_with_byte_tokens(tmp_path):
    """llm-foundry's older converter writes `tokens` as raw int64 bytes and nothing else."""
    from longpack.pipeline.formats.streaming_compat import import_streaming

    streaming = import_streaming()
    out = tmp_path / "foundry"
    with streaming.MDSWriter(out=str(out), columns={"tokens": "bytes"}, compression="zstd") as w:
        for row in ([1, 2, EOS, 3], [4, EOS, 5, EOS]):
            w.write({"tokens": np.array(row, np.int64).tobytes()})
    r = collect(out, eos_id=EOS)
    s = r["splits"]["foundry"]
    assert (s["rows"], s["documents"], s["seq"]) == (2, 3, 4)
    assert any("no document hashes" in n for n in r["checks"]["not_checked"])


def test_mds_columns_decode_as_mosaicml_streaming_wrote_them(tmp_path):
    """Every sample at once from the offsets table: variable-length arrays whose shape header
    takes 1, 2 or 4 bytes (lengths 1, 300, 70,000), at unaligned positions, beside a string
    column this reader ignores, read back as MDSWriter was given them."""
    from longpack.pipeline.formats.shards import open_split
    from longpack.pipeline.formats.streaming_compat import import_streaming

    streaming = import_streaming()
    rng = np.random.default_rng(0)
    lengths = [1, 300, 70_000, 3]
    samples = [{"note": "x" * int(rng.integers(0, 9)),
                "tokens": rng.integers(0, 60_000, 7).astype(np.uint16),
                "doc_starts": np.sort(rng.integers(0, 7, n)).astype(np.uint32),
                "doc_hashes": rng.integers(1, 2**63, n, dtype=np.uint64)} for n in lengths]
    out = tmp_path / "other"
    columns = {"note": "str", "tokens": "ndarray:uint16:7", "doc_starts": "ndarray:uint32",
               "doc_hashes": "ndarray:uint64"}
    with streaming.MDSWriter(out=str(out), columns=columns, compression="zstd") as w:
        for sample in samples:
            w.write(sample)
    shard = next(open_split(out).shards())
    assert np.array_equal(shard.tokens, np.stack([x["tokens"] for x in samples]))
    rows = np.repeat(np.arange(len(lengths)), lengths)
    assert np.array_equal(shard.segments[:, 0], rows)
    assert np.array_equal(shard.segments[:, 1], np.concatenate([x["doc_starts"] for x in samples]))
    assert np.array_equal(shard.segments[:, 2], np.concatenate([x["doc_hashes"] for x in samples]))


def test_mds_rows_of_different_lengths_are_a_shard_problem(tmp_path):
    from longpack.pipeline.formats.shards import ShardError, open_split
    from longpack.pipeline.formats.streaming_compat import import_streaming

    streaming = import_streaming()
    out = tmp_path / "ragged"
    with streaming.MDSWriter(out=str(out), columns={"tokens": "ndarray:uint32"}) as w:
        for n in (4, 4, 5):
            w.write({"tokens": np.arange(n, dtype=np.uint32)})
    with pytest.raises(ShardError, match=r"shard.00000.mds: .*rows of different lengths: \[4, 5\]"):
        next(open_split(out).shards())
    r = collect(out, eos_id=EOS)
    assert not r["checks"]["ok"]
    assert any("rows of different lengths" in p["what"] for p in r["checks"]["problems"])


def test_mds_arrays_of_two_dimensions_are_named_not_flattened(tmp_path):
    from longpack.pipeline.formats.shards import ShardError, open_split
    from longpack.pipeline.formats.streaming_compat import import_streaming

    streaming = import_streaming()
    out = tmp_path / "2d"
    with streaming.MDSWriter(out=str(out), columns={"tokens": "ndarray:uint32"}) as w:
        w.write({"tokens": np.arange(6, dtype=np.uint32).reshape(2, 3)})
    with pytest.raises(ShardError, match="'tokens' .*values of 2 dimensions; .*1-D arrays"):
        next(open_split(out).shards())


def test_an_mds_shard_whose_header_disagrees_with_its_index_is_named(tmp_path):
    from longpack.pipeline.formats.shards import ShardError, open_split
    from longpack.pipeline.formats.streaming_compat import import_streaming

    streaming = import_streaming()
    out = tmp_path / "edited"
    with streaming.MDSWriter(out=str(out), columns={"tokens": "ndarray:uint32"}) as w:
        w.write({"tokens": np.arange(4, dtype=np.uint32)})
    index = json.loads((out / "index.json").read_text())
    index["shards"][0]["column_encodings"] = ["ndarray:uint16"]
    (out / "index.json").write_text(json.dumps(index))
    with pytest.raises(ShardError, match="header disagrees with index.json on column_encodings"):
        next(open_split(out).shards())


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.slow
def test_shards_read_one_after_another_on_a_thread_keep_their_own_rows(
        tmp_path, byte_tokenizer, texts, compression, no_streaming_shared_memory_left):
    """Each thread decodes its shards in one reused buffer: what a read returns must not change
    when the same thread reads the next shard into that buffer."""
    from longpack.pipeline.formats.shards import open_split
    from longpack.pipeline.formats.streaming_compat import import_streaming

    out = make_build(tmp_path, texts, compression=compression)
    reader = open_split(out / "train")
    first = reader.read_shard(0)
    tokens, segments = first.tokens.copy(), first.segments.copy()
    later = [reader.read_shard(i) for i in range(1, len(reader.shard_files()))]
    assert later and np.array_equal(first.tokens, tokens)
    assert np.array_equal(first.segments, segments)
    streaming = import_streaming()  # and every shard reads as mosaicml-streaming reads it
    data = streaming.StreamingDataset(local=str(out / "train"), shuffle=False, batch_size=1)
    rows = np.concatenate([s.tokens for s in [first, *later]])
    assert np.array_equal(rows, np.stack([data[i]["tokens"] for i in range(len(data))]))


@pytest.mark.parametrize("fmt,compression", [("mds", "zstd"), ("mds", "none"), ("memmap", "none")])
def test_read_blocks_gives_the_rows_of_read_shard_block_by_block(tmp_path, byte_tokenizer, texts,
                                                                 fmt, compression):
    from longpack.pipeline.formats.shards import open_split

    reader = open_split(make_build(tmp_path, texts, fmt, compression=compression) / "train")
    for i in range(len(reader.shard_files())):
        whole = reader.read_shard(i)
        blocks = reader.read_blocks(i, block_bytes=3 * SEQ * whole.tokens.itemsize)
        got = [(first, rows.copy()) for first, rows in blocks.blocks]
        assert [first for first, _ in got] == list(range(0, len(whole.tokens), 3))
        assert np.array_equal(np.concatenate([rows for _, rows in got]), whole.tokens)
        assert (blocks.rows, blocks.seq, blocks.dtype) == (*whole.tokens.shape, whole.tokens.dtype)
        assert np.array_equal(blocks.segments, whole.segments)


def test_npy_read_whole_takes_any_layout_and_names_a_short_file(tmp_path):
    """Other tools' .npy files: C or Fortran order, format 1.0 or 2.0, read into the thread's
    buffer as np.load reads them; a file cut short or holding objects is a named problem."""
    from longpack.pipeline.formats.shards import ShardError, open_split

    rows = np.arange(6 * 40, dtype=np.uint32).reshape(6, 40) % 97
    np.save(tmp_path / "a.npy", rows)
    np.save(tmp_path / "b.npy", np.asfortranarray(rows[::-1]))
    with open(tmp_path / "c.npy", "wb") as f:
        np.lib.format.write_array(f, rows[:3], version=(2, 0))
    reader = open_split(tmp_path)
    for i, want in enumerate([rows, rows[::-1], rows[:3]]):
        got = np.concatenate([b.copy() for _, b in reader.read_blocks(i, 2 * 40 * 4).blocks])
        assert np.array_equal(got, want)
    whole = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "a.npy").write_bytes(whole[:-7])
    with pytest.raises(ShardError, match=r"a.npy: unreadable .npy \(its data is 953 bytes, its "
                                         r"header says 960\)"):
        reader.read_blocks(0, 1 << 20)
    np.save(tmp_path / "a.npy", np.array([[None, 1]], dtype=object), allow_pickle=True)
    with pytest.raises(ShardError, match="an array of Python objects"):
        reader.read_blocks(0, 1 << 20)
    r = collect(tmp_path)
    assert [p["file"] for p in r["checks"]["problems"]] == [f"{tmp_path.name}/a.npy"]


@pytest.mark.parametrize("pad_at", [None, (0, 0), (2, 5), (4, 0), (6, 63)])
@pytest.mark.parametrize("count_every", [1, 3, 8])
@pytest.mark.parametrize("block_rows", [1, 2, 3, 7, 50])
def test_digest_block_by_block_is_the_digest_of_the_whole(pad_at, count_every, block_rows):
    """Blocks of any size, padding from any (row, offset) on, any row sample: the figures are
    those of the shard's real tokens taken whole."""
    from longpack.pipeline.formats.shards import ShardBlocks
    from longpack.pipeline.stats.scan import digest

    rng = np.random.default_rng(block_rows * 100 + count_every)
    n, seq, vocab = 7, SEQ, 300
    tokens = rng.integers(0, 50, (n, seq)).astype(np.uint16)
    tokens[rng.random((n, seq)) < 0.05] = EOS % vocab
    tokens[3, 17] = 299  # the first row with an id >= vocab_size 290
    segments = np.array([[r, 0, 7 + r] for r in range(n)], np.uint64)
    real = n * seq
    if pad_at is not None:
        real = pad_at[0] * seq + pad_at[1]
        tokens.reshape(-1)[real:] = 0
        segments = np.concatenate([segments[segments[:, 0] < pad_at[0] + (pad_at[1] > 0)],
                                   [[pad_at[0], pad_at[1], 0]]]).astype(np.uint64)
    blocks = ((a, tokens[a:a + block_rows].copy()) for a in range(0, n, block_rows))
    d = digest(ShardBlocks(Path("s"), n, seq, tokens.dtype, segments, blocks), EOS % vocab,
               count_every, vocab_size=290)
    flat = tokens.reshape(-1)[:real]
    counted = np.concatenate([tokens[r][:max(0, min(seq, real - r * seq))]
                              for r in range(0, n, count_every)])
    assert d.real == real
    assert (d.lo, d.hi) == ((int(flat.min()), int(flat.max())) if real else (None, None))
    assert np.array_equal(np.trim_zeros(d.counts, "b"),
                          np.trim_zeros(np.bincount(counted, minlength=1), "b"))
    assert np.array_equal(d.eos, np.flatnonzero(flat == EOS % vocab))
    assert np.array_equal(d.last, tokens[:, -1])
    assert d.over_vocab_row == (3 if real > 3 * seq + 17 else None)


@pytest.mark.parametrize("compression,says", [("zstd", "decompresses to"), ("none", "holds")])
@pytest.mark.parametrize("change", [-1, 1])
def test_an_mds_shard_of_other_than_its_indexed_size_is_named(
        tmp_path, byte_tokenizer, texts, compression, says, change):
    from longpack.pipeline.formats.shards import ShardError, open_split

    out = make_build(tmp_path, texts, compression=compression)
    index_path = out / "train" / "index.json"
    index = json.loads(index_path.read_text())
    size = index["shards"][0]["raw_data"]["bytes"]
    index["shards"][0]["raw_data"]["bytes"] = size + change
    index_path.write_text(json.dumps(index))
    more = "more than " if change < 0 else ""
    with pytest.raises(ShardError, match=f"{says} {more}{size - (change < 0):,} bytes, "
                                         f"index.json says {size + change:,}"):
        open_split(out / "train").read_shard(0)


def test_one_split_directory_uses_the_builds_manifest(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts)
    r = collect(out / "val", verify=True)
    assert list(r["splits"]) == ["val"] and r["tokenizer"]["eos_id"] == EOS and r["checks"]["ok"]


def test_an_unfinished_build_says_to_resume_it(tmp_path, byte_tokenizer, texts):
    out = make_build(tmp_path, texts)
    (out / "manifest.json").unlink()
    (out / ".longpack-build").mkdir()
    r = run_stats(out)
    assert r.exit_code == 1 and "unfinished build" in r.output and "re-run the same" in r.output


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 64, 1001])
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_find_rare_is_flatnonzero_of_equal(length, dtype):
    rng = np.random.default_rng(length)
    flat = rng.integers(0, 5, length).astype(dtype)  # hits everywhere, runs of them, none
    for value in (0, 4, 7):
        assert np.array_equal(find_rare(flat, value), np.flatnonzero(flat == value))
    if length:
        flat[:] = 3
        flat[-1] = flat[0] = 9  # a hit in the first word and in the tail
        assert find_rare(flat, 9).tolist() == sorted({0, length - 1})
    rows = rng.integers(0, 5, (3, length)).astype(dtype)
    strided = rows[::2].reshape(-1)[1:]  # a copy of every other row, less its first token
    assert np.array_equal(find_rare(strided, 2), np.flatnonzero(strided == 2))
    assert np.array_equal(find_rare(rows[:, ::3].reshape(-1), 2),
                          np.flatnonzero(rows[:, ::3].reshape(-1) == 2))


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.slow
def test_every_format_is_read_one_thread_per_core_and_the_report_does_not_depend_on_it(
        tmp_path, byte_tokenizer, texts, monkeypatch, compression):
    """One read plan for compressed and raw shards alike (item 7 of issue 14: the per-format
    plans measured within noise), at most MAX_READ_THREADS; the figures are the same with one
    thread as with several."""
    from longpack.pipeline.stats import report as stats_report

    out = make_build(tmp_path, texts, compression=compression)
    reports = []
    for cores, threads in (({0}, 1), ({0, 1}, 2), (set(range(16)), stats_report.MAX_READ_THREADS)):
        monkeypatch.setattr("os.sched_getaffinity", lambda pid, cores=cores: cores)
        assert stats_report.read_threads() == threads
        reports.append(collect(out, verify=True))
    assert reports[0]["checks"]["ok"] and reports[0] == reports[1] == reports[2]


def test_read_ahead_closed_early_cancels_the_shards_not_started(tmp_path, byte_tokenizer, texts,
                                                               monkeypatch):
    """Shard 0 is read at once, every later one blocks in its thread until the stream is
    closed: closing after shard 0 returns at once, lets the shards being read finish and never
    starts the rest. No timing involved: with both threads held by shards 1 and 2, shard 3 can
    start only once they are let go, which is after the close."""
    import threading

    from longpack.pipeline.formats.shards import SplitReader
    from longpack.pipeline.stats import report as stats_report

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    reader = SplitReader(make_build(tmp_path, texts) / "train", EOS)
    threads = stats_report.read_threads()
    assert threads == 2 and len(reader.shard_files()) > threads + 2
    started, let_go, held = [], threading.Event(), []
    real_read = reader.read_blocks

    def blocking_read(i, *args, **kwargs):
        started.append(i)
        if i > 0:
            held.append(let_go.wait(10))  # False: close() waited for the held reads
        return real_read(i, *args, **kwargs)

    monkeypatch.setattr(reader, "read_blocks", blocking_read)
    shards = stats_report._read_ahead(reader, EOS, 1, None)
    next(shards)  # shards 0-2 were queued, shard 3 now too; 1 and 2 are being read, or soon
    shards.close()  # returns with shards 1 and 2 still held
    let_go.set()
    for thread in threading.enumerate():
        if thread.name.startswith("read-shard"):
            thread.join(30)
    assert 0 in started and set(started) <= set(range(1 + threads)) and all(held)


def test_train_keeps_no_document_hashes_with_or_without_val(tmp_path, byte_tokenizer, texts,
                                                            monkeypatch):
    """Memory bounded: only val's hashes are held for the overlap check; train's stream by.
    (Train without a val split used to keep 8 bytes per document: RSS grew with the data.)"""
    import shutil

    from longpack.pipeline.stats import report as stats_report

    scans, real_scan = [], stats_report.SplitScan

    def recorded_scan(*args, **kwargs):
        scans.append(real_scan(*args, **kwargs))
        return scans[-1]

    monkeypatch.setattr(stats_report, "SplitScan", recorded_scan)
    out = make_build(tmp_path, texts)
    assert collect(out)["checks"]["ok"]
    kept = {s.name: sum(len(h) for h in s.hashes) for s in scans}
    assert kept["train"] == 0 and kept["val"] == expected(texts, "val")["documents"]
    shutil.rmtree(out / "val")
    (out / "manifest.json").unlink()
    (out / "skipped.jsonl").unlink()  # no trace of a build left: shards of no manifest
    scans.clear()
    report = collect(out, eos_id=EOS)
    assert report["checks"]["ok"] and report["splits"]["train"]["documents"] > 0
    assert [(s.name, s.hashes) for s in scans] == [("train", [])]


def test_plot_never_replaces_a_file_of_the_build_or_a_users_non_png(tmp_path, byte_tokenizer,
                                                                     texts):
    """--plot OUT/manifest.json used to write the PNG over the manifest, destroying the build."""
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts[:200]])
    out = tmp_path / "b"
    build(BuildConfig(out=str(out), dataset="jsonl", inputs=(str(corpus),),
                      tokenizer=byte_tokenizer, seq=65), show_progress=False)
    manifest = (out / "manifest.json").read_bytes()
    (tmp_path / "notes.txt").write_text("a user's notes")
    for path, plot, says in ((out, out / "manifest.json", "is inside"),
                             (out / "train", out / "manifest.json", "exists and is not a PNG"),
                             (out, tmp_path / "notes.txt", "exists and is not a PNG")):
        r = CliRunner().invoke(pack, ["stats", str(path), "--plot", str(plot)])
        assert r.exit_code == 1 and says in r.output and "Traceback" not in r.output, r.output
    assert (out / "manifest.json").read_bytes() == manifest
    assert (tmp_path / "notes.txt").read_text() == "a user's notes"


@pytest.mark.slow
def test_plot_replaces_an_earlier_plot(tmp_path, byte_tokenizer, texts):
    pytest.importorskip("matplotlib")
    out = make_build(tmp_path, texts)
    for _ in range(2):
        assert run_stats(out, "--plot", str(tmp_path / "p.png")).exit_code == 0
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_edited_totals_and_a_missing_skip_log_are_problems(tmp_path, byte_tokenizer, texts):
    """Both passed as OK: the top-level counts are not the shards', and the skip log the
    manifest names is part of the build."""
    out = make_build(tmp_path, texts)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["counts"]["tokens"] += 5
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "skipped.jsonl").unlink()
    r = collect(out)
    said = [f"{p['file']}: {p['what']}" for p in r["checks"]["problems"]]
    total = sum(s["tokens"] for s in manifest["splits"].values())
    assert not r["checks"]["ok"] and said == [
        f"manifest.json: counts.tokens is {total + 5}, its splits' tokens add up to {total:,}",
        "skipped.jsonl: missing (manifest.json names it: the records the build skipped)"]
