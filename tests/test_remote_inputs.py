"""--input s3://...: a real S3 server (moto's, on 127.0.0.1); the bytes of a local build of the
same files, skips named by URL, parquet read by range (never fetched whole), tasks split a
remote parquet file at its row groups, one-line errors."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from conftest import build_tree, make_texts, write_jsonl, write_parquet
from longpack.core.errors import SettingsError
from longpack.pipeline.build import Build, build
from longpack.pipeline.cli import pack
from longpack.pipeline.config import BuildConfig
from longpack.pipeline.distribute import tasks


def settings(out, inputs, tokenizer: str, dataset: str, **kw) -> BuildConfig:
    base = dict(out=str(out), dataset=dataset, inputs=tuple(inputs), tokenizer=tokenizer,
                seq=128, val_fraction=0.1, shard_bytes=128 * 2 * 50, workers=2)
    return BuildConfig(**{**base, **kw})


def same_but_inputs(remote: dict, local: dict) -> None:
    """Two build trees equal but for the inputs' names (paths vs URLs) in manifest.json."""
    a, b = (json.loads(t.pop("manifest.json")) for t in (remote, local))
    for m in (a, b):
        m.pop("inputs"), m["fingerprint"].pop("inputs")
    assert a == b
    assert remote.keys() == local.keys()
    for name in remote:
        if name != "skipped.jsonl":
            assert remote[name] == local[name], name


@pytest.fixture
def jsonl_corpus(tmp_path):
    folder = tmp_path / "jsonl"
    folder.mkdir()
    texts = make_texts(300, seed=4)
    write_jsonl(folder / "a.jsonl", [{"text": t} for t in texts[:100]] + [b"{bad json"])
    write_jsonl(folder / "b.jsonl.gz", [{"text": t} for t in texts[100:200]], compress="gz")
    write_jsonl(folder / "c.jsonl.zst", [{"text": t} for t in texts[200:]], compress="zst")
    data = gzip.compress(b"".join(json.dumps({"text": t}).encode() + b"\n" for t in texts[:50]))
    (folder / "d.jsonl.gz").write_bytes(data[: len(data) // 2])  # truncated
    (folder / "notes.txt").write_text("not a document")
    return folder


@pytest.mark.slow
def test_a_build_from_a_bucket_is_the_build_from_the_same_local_files(tmp_path, s3,
                                                                      jsonl_corpus,
                                                                      byte_tokenizer):
    url = s3.upload_tree(jsonl_corpus, "corpus")
    build(settings(tmp_path / "local", [jsonl_corpus], byte_tokenizer, "jsonl"),
          show_progress=False)
    m = build(settings(tmp_path / "remote", [url + "/"], byte_tokenizer, "jsonl"),
              show_progress=False)
    assert [i["path"] for i in m["inputs"]] == [f"{url}/{n}" for n in
                                              ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst",
                                               "d.jsonl.gz")]
    assert all(i["etag"] and i["size"] for i in m["inputs"])
    same_but_inputs(build_tree(tmp_path / "remote"), build_tree(tmp_path / "local"))
    skips = [json.loads(line) for line in
             (tmp_path / "remote" / "skipped.jsonl").read_text().splitlines()]
    assert {(s["file"], s["reason"]) for s in skips} == {
        (f"{url}/a.jsonl", "bad_json"), (f"{url}/d.jsonl.gz", "truncated_file")}
    # a glob, and an object named exactly, pick the same way a local glob and path do
    m = build(settings(tmp_path / "glob", [f"{url}/*.zst", f"{url}/a.jsonl"], byte_tokenizer,
                       "jsonl"), show_progress=False)
    assert [i["path"] for i in m["inputs"]] == [f"{url}/a.jsonl", f"{url}/c.jsonl.zst"]


@pytest.mark.slow
def test_a_replaced_object_changes_the_build(tmp_path, s3, jsonl_corpus, byte_tokenizer):
    url = s3.upload_tree(jsonl_corpus, "corpus")
    cfg = settings(tmp_path / "out", [url], byte_tokenizer, "jsonl")
    build(cfg, show_progress=False)
    s3.client.put_object(Bucket=s3.name, Key="corpus/a.jsonl", Body=b'{"text": "new"}\n')
    with pytest.raises(SettingsError, match="inputs changed"):
        build(cfg, show_progress=False)


@pytest.fixture
def big_parquet(tmp_path):
    """~20 MB of parquet in 40 row groups of barely compressible text."""
    import numpy as np

    rng = np.random.default_rng(0)
    texts = [rng.bytes(2500).hex() for _ in range(8000)]
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=200, compression="none")
    return path


@pytest.mark.slow
def test_parquet_is_read_by_range_never_fetched_whole(tmp_path, s3, big_parquet, byte_tokenizer,
                                                      monkeypatch):
    from s3fs.core import S3File

    fetched = []
    fetch = S3File._fetch_range

    def counted(self, start, end):
        fetched.append(end - start)
        return fetch(self, start, end)

    monkeypatch.setattr(S3File, "_fetch_range", counted)
    url = s3.upload_tree(big_parquet.parent, "pq") + "/big.parquet"
    size = big_parquet.stat().st_size
    m = build(settings(tmp_path / "out", [url], byte_tokenizer, "parquet", max_tokens=20_000),
              show_progress=False)
    assert m["counts"]["tokens"] >= 20_000
    assert 0 < sum(fetched) < 0.6 * size, (sum(fetched), size)


@pytest.mark.slow
def test_tasks_split_a_remote_parquet_file_at_its_row_groups(tmp_path, s3, byte_tokenizer):
    folder = tmp_path / "pq"
    folder.mkdir()
    texts = make_texts(900, seed=9)
    write_parquet(folder / "a.parquet", texts[:800], row_group_size=40)
    write_parquet(folder / "b.parquet", texts[800:], row_group_size=40)
    url = s3.upload_tree(folder, "pq")
    build(settings(tmp_path / "local", [folder], byte_tokenizer, "parquet"), show_progress=False)
    cfg = settings(tmp_path / "tasked", [url], byte_tokenizer, "parquet", tasks=3)
    shares = []
    for i in range(3):
        with Build(cfg, task=i) as b:
            shares.append(b.share)
    assert any(s.start[1] > 0 for s in shares)  # a share starts inside a.parquet
    for i in range(3):
        tasks.run_task(cfg, i, show_progress=False)
    same_but_inputs(build_tree(tmp_path / "tasked"), build_tree(tmp_path / "local"))


@pytest.mark.slow
def test_missing_bucket_or_files_are_one_line(tmp_path, s3, byte_tokenizer):
    runner = CliRunner()
    base = ["build", "--dataset", "jsonl", "--tokenizer", byte_tokenizer, "--seq", "128"]
    result = runner.invoke(pack, [*base, "--input", "s3://no-such-bucket/x",
                                  "--out", str(tmp_path / "a")])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "the bucket no-such-bucket does not exist" in result.output
    result = runner.invoke(pack, [*base, "--input", s3.url("empty/"), "--out",
                                  str(tmp_path / "b")])
    assert result.exit_code == 1, result.output
    assert f"Error: --input {s3.url('empty/')}: no jsonl files there" in result.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
