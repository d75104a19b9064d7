"""pack import against hostile input: ids no vocabulary holds, pickles that would run code,
tensors and arrays that are not [N, seq] integer ids, damaged files and bad flags. Each is
refused in one "Error: ..." line naming the file (and row and id), before anything is
written; none is cast with wraparound, none is unpickled."""

import json
import pickle
import zipfile

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import build_tree, small_build
from longpack.core.errors import SettingsError
from longpack.pipeline.adopt.config import ImportConfig
from longpack.pipeline.adopt.readers import at_least
from longpack.pipeline.cli import pack

EOS = 50256


def refused(tmp_path, src, *flags, says: str | list[str], code: int = 1) -> str:
    """Run `pack import SRC`; it must fail in one last Error: line holding each of `says`,
    without a traceback, leaving no output that looks complete."""
    out = tmp_path / "out"
    result = CliRunner().invoke(pack, ["import", str(src), "--out", str(out),
                                       *map(str, flags)])
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # no traceback
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "Traceback" not in result.output, result.output
    for part in [says] if isinstance(says, str) else says:
        assert part in last, last
    assert not (out / "manifest.json").exists()
    return last


def imported(tmp_path, src, *flags) -> tuple[dict, np.ndarray, list[dict], str]:
    from longpack.pipeline.formats.shards import open_split

    out = tmp_path / "out"
    result = CliRunner().invoke(pack, ["import", str(src), "--out", str(out),
                                       *map(str, flags)])
    assert result.exit_code == 0, result.output
    rows = np.array([np.asarray(r) for r, _, _ in open_split(out / "train").rows()])
    skips = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    return json.loads((out / "manifest.json").read_text()), rows, skips, result.output


# -- ids that no output dtype (or no vocabulary) holds ----------------------------------------

@pytest.mark.parametrize("dtype,value", [("int64", 2**40), ("uint64", 2**64 - 1),
                                         ("uint64", 2**63), ("int64", 2**32 - 1)])
def test_without_a_tokenizer_an_id_beyond_any_vocabulary_is_refused_not_wrapped(
        tmp_path, dtype, value):
    rows = np.zeros((3, 4), dtype)
    rows[1, 2] = value
    np.save(tmp_path / "r.npy", rows)
    refused(tmp_path, tmp_path / "r.npy", says=[f"{tmp_path / 'r.npy'}: row 1 holds id "
                                                f"{value:,}", "--tokenizer"])
    assert not (tmp_path / "out").exists()  # refused before the output is touched


def test_with_a_tokenizer_such_rows_are_skipped_and_the_rest_kept_exactly(
        tmp_path, byte_tokenizer):
    rows = np.arange(40, dtype=np.uint64).reshape(5, 8)
    rows[0, 7] = EOS
    rows[1, 0] = 2**64 - 1
    rows[3, 5] = 2**63  # -2**63 as an int64: beyond the vocabulary, not negative
    np.save(tmp_path / "u.npy", rows)
    m, got, skips, _ = imported(tmp_path, tmp_path / "u.npy", "--tokenizer", byte_tokenizer)
    assert np.array_equal(got, rows[[0, 2, 4]].astype(np.uint16))
    assert m["tokenizer"]["vocab_size"] == 50257 and m["dtype"] == "uint16"
    assert [(s["row"], s["reason"], s["detail"]) for s in skips] == [
        (1, "id_out_of_range", f"ids 9..{2**64 - 1}, the vocabulary has 50257"),
        (3, "id_out_of_range", f"ids 24..{2**63}, the vocabulary has 50257")]


def test_negative_ids_of_a_signed_type_skip_their_row(tmp_path, byte_tokenizer):
    rows = np.full((3, 4), EOS, np.int64)
    rows[1, 1] = -(2**63)
    np.save(tmp_path / "s.npy", rows)
    m, got, skips, _ = imported(tmp_path, tmp_path / "s.npy", "--tokenizer", byte_tokenizer)
    assert np.array_equal(got, rows[[0, 2]])
    assert [(s["row"], s["detail"]) for s in skips] == [
        (1, f"ids {-(2**63)}..{EOS}, the vocabulary has 50257")]


def test_at_least_is_exact_for_64_bit_ids():
    """2**63 + 1 and 2**63 are one float64; uint64 against int64 bounds goes through float64."""
    u = np.array([2**63, 2**63 + 1, 2**64 - 1], np.uint64)
    assert at_least(u, 2**63 + 1).tolist() == [False, True, True]
    assert at_least(u, 0).all() and not at_least(u, 2**64).any()
    s = np.array([-(2**63), -1, 2**63 - 1], np.int64)
    assert at_least(s, 0).tolist() == [False, False, True]
    assert at_least(s, 2**63 - 1).tolist() == [False, False, True]
    assert not at_least(s, 2**63).any() and at_least(s, -(2**64)).all()


@pytest.mark.slow
def test_an_mds_tokens_column_of_huge_int64_is_refused_naming_its_row(tmp_path):
    from longpack.pipeline import import_streaming

    rows = np.zeros((30, 8), np.int64)
    rows[17, 3] = 2**40
    with import_streaming().MDSWriter(out=str(tmp_path / "src" / "train"),
                                      columns={"tokens": "ndarray:int64"},
                                      size_limit=400) as writer:  # several shards
        for row in rows:
            writer.write({"tokens": row})
    refused(tmp_path, tmp_path / "src", says=f"{tmp_path / 'src' / 'train'}: row 17 holds id "
                                             "1,099,511,627,776")


def test_an_mds_tokens_column_of_floats_is_refused(tmp_path):
    from longpack.pipeline import import_streaming

    with import_streaming().MDSWriter(out=str(tmp_path / "src"),
                                      columns={"tokens": "ndarray:float32"}) as writer:
        writer.write({"tokens": np.full(8, 1.5, np.float32)})  # astype would make it 1
    refused(tmp_path, tmp_path / "src", says=["shard.00000.mds", "float32", "integer ids"])


def test_a_tokenizer_far_larger_than_the_data_is_warned_about(tmp_path, byte_tokenizer):
    np.save(tmp_path / "r.npy", np.arange(64, dtype=np.int32).reshape(8, 8))
    *_, output = imported(tmp_path, tmp_path / "r.npy", "--tokenizer", byte_tokenizer)
    assert "the largest id in" in output and "is 63, and --tokenizer" in output


@pytest.mark.parametrize("flags,says", [
    (["--eos-id", 50257, "--tokenizer", "TOK"], "--eos-id 50257 is not an id of --tokenizer"),
    (["--eos-id", 1000], "--eos-id 1000 is above every id in"),
])
def test_an_eos_id_beyond_the_vocabulary_is_refused(tmp_path, byte_tokenizer, flags, says):
    np.save(tmp_path / "r.npy", np.arange(64, dtype=np.int32).reshape(8, 8))
    refused(tmp_path, tmp_path / "r.npy",
            *[byte_tokenizer if f == "TOK" else f for f in flags], says=says)


# -- .pt files: pickles are never run, only dense integer tensors are rows --------------------

class _Marker:
    """Unpickled, this would create a file: the test that it is never created."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


@pytest.mark.parametrize("container", ["pickle", "torch zip"])
def test_a_pickle_that_would_run_code_is_refused_unrun(tmp_path, monkeypatch, container):
    marker = tmp_path / "ran"
    src = tmp_path / "evil.pt"
    if container == "pickle":
        src.write_bytes(pickle.dumps(_Marker(marker), protocol=2))
    else:  # a real torch.save archive whose data.pkl is swapped
        torch.save(torch.zeros(2, 4, dtype=torch.int64), tmp_path / "good.pt")
        with zipfile.ZipFile(tmp_path / "good.pt") as good, zipfile.ZipFile(src, "w") as bad:
            for info in good.infolist():
                data = good.read(info)
                if info.filename.endswith("/data.pkl"):
                    data = pickle.dumps(_Marker(marker), protocol=2)
                bad.writestr(info, data)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # cannot undo weights_only
    refused(tmp_path, src, says=[f"{src}: not a plain tensor file", "none of it was run"])
    assert not marker.exists()


@pytest.mark.parametrize("tensor,says", [
    (torch.zeros(2, 4, dtype=torch.bfloat16), "torch.bfloat16 tensor"),
    (torch.zeros(2, 4), "torch.float32 tensor"),
    (torch.zeros(2, 4, dtype=torch.int64).to_sparse(), "torch.sparse_coo tensor"),
    (torch.zeros(8, dtype=torch.int64), "int64 values of shape [8]"),
    (torch.zeros(2, 4, 2, dtype=torch.int64), "int64 values of shape [2, 4, 2]"),
    ({"rows": torch.zeros(2, 4, dtype=torch.int64)}, "holds a dict, not a tensor"),
], ids=["bf16", "float", "sparse", "1-D", "3-D", "dict"])
def test_a_pt_that_is_not_one_dense_integer_tensor_is_refused(tmp_path, tensor, says):
    torch.save(tensor, tmp_path / "t.pt")
    refused(tmp_path, tmp_path / "t.pt", says=[f"{tmp_path / 't.pt'}: ", says])


# -- damaged and mistyped files ---------------------------------------------------------------

def _truncated_npy(path):
    np.save(path, np.zeros((100, 4), np.int32))
    path.write_bytes(path.read_bytes()[:300])


@pytest.mark.parametrize("name,make,says", [
    ("e.npy", lambda p: p.write_bytes(b""), "an empty file (0 bytes)"),
    ("e.pt", lambda p: p.write_bytes(b""), "an empty file (0 bytes)"),
    ("t.npy", _truncated_npy, "truncated: its header says int32 [100, 4] (1,600 bytes)"),
    ("o.npy", lambda p: np.save(p, np.array([[1, 2]], dtype=object), allow_pickle=True),
     "holds Python objects"),
    ("g.pt", lambda p: p.write_bytes(b"PK\x03\x04 not a zip at all"),
     "not a readable torch.save file"),
])
def test_a_damaged_file_is_refused_in_one_line(tmp_path, name, make, says):
    make(tmp_path / name)
    refused(tmp_path, tmp_path / name, says=[f"{tmp_path / name}: ", says])


def test_a_bin_that_is_not_whole_ids_of_its_dtype_is_refused(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\0" * 101)
    refused(tmp_path, tmp_path / "x.bin", "--seq", 4, "--dtype", "uint16",
            says="101 bytes are not whole uint16 ids")
    (tmp_path / "e.bin").write_bytes(b"")
    refused(tmp_path, tmp_path / "e.bin", "--seq", 4, "--dtype", "uint16",
            says="an empty file (0 bytes)")


@pytest.mark.parametrize("flags,says,code", [
    (["--dtype", "foo"], "'--dtype': 'foo' is not one of 'uint8'", 2),
    (["--dtype", "float32"], "'--dtype': 'float32' is not one of", 2),
    (["--dtype", "uint16", "--seq", 0], "--seq must be at least 2 (got 0)", 1),
    (["--dtype", "uint16", "--seq", -3], "--seq must be at least 2 (got -3)", 1),
    (["--dtype", "uint16", "--seq", 4, "--eos-id", -1], "--eos-id must be at least 0 (got -1)",
     1),
    (["--dtype", "uint16", "--seq", 4, "--format", "foo"], "'--format'", 2),
])
def test_bad_flags_are_refused_in_one_line(tmp_path, flags, says, code):
    np.zeros(64, np.uint16).tofile(tmp_path / "x.bin")
    refused(tmp_path, tmp_path / "x.bin", *flags, says=says, code=code)


def test_every_integer_dtype_reads_a_bin(tmp_path):
    """int8 or uint64, a .bin of ids is read as its --dtype says (little-endian)."""
    ids = np.array([1, 2, 3, 4, 5, 6, 7, 8], "<i8")
    ids.astype("i1").tofile(tmp_path / "x.bin")
    _, got, _, _ = imported(tmp_path, tmp_path / "x.bin", "--seq", 4, "--dtype", "int8")
    assert got.tolist() == ids.reshape(2, 4).tolist()


@pytest.mark.parametrize("kwargs,says", [
    ({"seq": 0}, "--seq must be at least 2 (got 0)"),
    ({"dtype": "float16"}, "--dtype 'float16': choose one of uint8, uint16"),
    ({"eos_id": -1}, "--eos-id must be at least 0 (got -1)"),
    ({"format": "foo"}, "--format 'foo': choose one of mds, memmap"),
    ({"shard_bytes": 0}, "--shard-bytes must be at least 1 (got 0)"),
])
def test_a_python_caller_gets_the_same_refusals(kwargs, says):
    with pytest.raises(SettingsError) as e:
        ImportConfig(src="x", out="y", **kwargs)
    assert says in str(e.value)


# -- an --out that holds the other kind of build ------------------------------------------------

def test_an_import_into_a_pack_build_and_a_build_into_an_import_are_one_line(
        tmp_path, byte_tokenizer):
    """The two fingerprints have other keys (an import's has `import`, its settings others):
    the refusal names which command made what is there, and touches none of it."""
    built = small_build(tmp_path, byte_tokenizer, "built", 30, seed=0)
    rows = tmp_path / "rows"
    rows.mkdir()
    np.save(rows / "t.npy", np.arange(2 * 64, dtype=np.int64).reshape(2, 64) % 200)
    before = build_tree(built)
    result = CliRunner().invoke(pack, ["import", str(rows), "--out", str(built)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: {built} holds a build with different settings (it is the "
                           "output of pack build, this command's of pack import"), last
    assert build_tree(built) == before

    imported_out = tmp_path / "imported"
    assert CliRunner().invoke(pack, ["import", str(rows), "--out", str(imported_out),
                                     "--quiet"]).exit_code == 0
    src = tmp_path / "built.jsonl"  # small_build's corpus
    result = CliRunner().invoke(pack, ["build", "--dataset", "jsonl", "--input", str(src),
                                       "--tokenizer", byte_tokenizer, "--seq", "65",
                                       "--out", str(imported_out), "--quiet"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "it is the output of pack import, this command's of pack build" in \
        result.output.strip().splitlines()[-1]


def test_an_out_that_is_src_or_holds_it_or_is_inside_it_is_refused_and_src_kept(
        tmp_path, byte_tokenizer):
    """--overwrite used to delete the build it was importing (OUT = SRC), then fail on it."""
    (tmp_path / "b").mkdir()
    src = small_build(tmp_path / "b", byte_tokenizer, "mds", 20, seed=1)
    before = build_tree(src)
    for out, says in ((src, "is SRC"), (src.parent, "holds SRC"), (src / "again", "is inside")):
        r = CliRunner().invoke(pack, ["import", str(src), "--out", str(out), "--overwrite"])
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
        assert says in r.output and "give an --out outside SRC" in r.output
    assert build_tree(src) == before and not (src / "again").exists()


def test_one_file_under_two_names_is_refused_not_imported_twice(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "train.npy", np.arange(64, dtype=np.uint16).reshape(4, 16))
    (src / "val.npy").symlink_to("train.npy")
    refused(tmp_path, src, says=["val.npy and", "train.npy are the same file", "twice"])


def test_an_import_that_keeps_no_row_is_an_error_not_an_empty_build(tmp_path):
    src = tmp_path / "neg"
    src.mkdir()
    np.save(src / "a.npy", -np.ones((4, 16), dtype=np.int32))
    refused(tmp_path, src, says=["no row imported", "4 rows read", "4 id_out_of_range",
                                 "skipped.jsonl"])
    empty = tmp_path / "empty"
    empty.mkdir()
    np.save(empty / "a.npy", np.zeros((0, 16), dtype=np.uint16))
    refused(tmp_path / "empty-out", empty, says="its files hold no rows")


def test_dtype_without_a_bin_file_is_refused_not_ignored(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.arange(64, dtype=np.uint16).reshape(4, 16))
    refused(tmp_path, src, "--dtype", "uint8", says="holds no .bin file")
