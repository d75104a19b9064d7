"""pack stats s3://...: against a real S3 server (moto's, on 127.0.0.1), the report of the local
folder; --verify catches a damaged object by its name; missing objects and unfinished builds
are said as for a local build; nothing of the shards is kept."""

import json
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import make_texts, write_jsonl
from longpack.pipeline.build import build
from longpack.pipeline.cli import pack
from longpack.pipeline.config import BuildConfig


def make_build(tmp_path: Path, tokenizer: str, fmt: str) -> Path:
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(200)] + [b"{bad"])
    out = tmp_path / fmt
    build(BuildConfig(out=str(out), dataset="jsonl", inputs=(str(tmp_path / "d.jsonl"),),
                      tokenizer=tokenizer, seq=65, val_fraction=0.1, format=fmt,
                      shard_bytes=65 * 2 * 16), show_progress=False)
    return out


def stats(*args) -> tuple[int, str]:
    result = CliRunner().invoke(pack, ["stats", *map(str, args)])
    return result.exit_code, result.output


def leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("longpack-stats.*")}


@pytest.mark.parametrize("fmt", ["mds", "memmap"])
@pytest.mark.slow
def test_the_report_of_a_build_in_a_bucket_is_the_local_one(tmp_path, s3, byte_tokenizer, fmt):
    out = make_build(tmp_path, byte_tokenizer, fmt)
    url = s3.upload_tree(out, "build")
    before = leftovers()
    for verify in ([], ["--verify"]):
        code_local, local = stats(out, "--json", *verify)
        code_remote, remote = stats(url, "--json", *verify)
        assert code_local == code_remote == 0, remote
        a, b = json.loads(local), json.loads(remote)
        assert b.pop("path") == url and a.pop("path") == str(out)
        assert a == b
    code, text = stats(url)
    assert code == 0 and text.startswith(f"pack stats {url}  ({fmt}")
    code, row = stats(url, "--decode", "3")
    assert code == 0 and row == stats(out, "--decode", "3")[1]
    assert leftovers() == before  # nothing kept


@pytest.mark.slow
def test_decode_at_a_url_reads_the_builds_fetched_copy_of_its_tokenizer(tmp_path, s3,
                                                                       byte_tokenizer):
    """The row is decoded with the copy of its tokenizer the build keeps, fetched with its
    manifest and checked, not with the file it was built from (`tokenizer.source`: a path on
    the machine that built it, here gone): that file used to be read, and the row came out as
    ids."""
    out = make_build(tmp_path, byte_tokenizer, "mds")
    url = s3.upload_tree(out, "build")
    code, local = stats(out, "--decode", "3")
    Path(byte_tokenizer).unlink()
    code_remote, remote = stats(url, "--decode", "3")
    assert code == code_remote == 0 and remote == local
    assert any(word in remote for word in ("alpha", "beta", "gamma"))  # text, not ids


@pytest.mark.slow
def test_verify_names_a_damaged_object_and_a_missing_one(tmp_path, s3, byte_tokenizer):
    out = make_build(tmp_path, byte_tokenizer, "mds")
    url = s3.upload_tree(out, "build")
    shard = sorted(p.name for p in (out / "train").glob("shard.*"))[1]
    data = bytearray(s3.read(f"build/train/{shard}"))
    data[len(data) // 2] ^= 0xFF
    s3.client.put_object(Bucket=s3.name, Key=f"build/train/{shard}", Body=bytes(data))
    code, text = stats(url, "--verify")
    assert code == 1
    assert f"train/{shard}: checksum mismatch (sha256)" in text
    last = sorted(p.name for p in (out / "train").glob("shard.*"))[-1]
    s3.client.delete_object(Bucket=s3.name, Key=f"build/train/{last}")
    code, text = stats(url)
    assert code == 1 and f"train/{last}: missing" in text


@pytest.mark.slow
def test_an_unfinished_build_and_an_empty_prefix_are_one_line(s3):
    s3.client.put_object(Bucket=s3.name, Key="half/.longpack-build/fingerprint.json", Body=b"{}")
    code, text = stats(s3.url("half"))
    assert code == 1 and text == (f"Error: {s3.url('half')}: an unfinished build (no "
                                  "manifest.json yet); re-run the same pack build command to "
                                  "finish it\n")
    code, text = stats(s3.url("nothing"))
    assert code == 1 and text.startswith(f"Error: {s3.url('nothing')}: nothing there")
    code, text = stats("s3://no-such-bucket/x")
    assert code == 1 and "the bucket no-such-bucket does not exist" in text
