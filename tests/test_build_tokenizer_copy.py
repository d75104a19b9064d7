"""A build keeps a copy of its tokenizer (OUT/tokenizer.tiktoken or tokenizer.json, named in
the manifest beside its sha256), so the model zoo finds it from any folder; a file path is
recorded absolute; a build killed before its manifest resumes with the copy as its own file;
a tiny --seq is said in the summary."""

import hashlib
import json
import os
import shutil

import pytest

from conftest import make_texts, write_byte_ranks, write_byte_tokenizer_json, write_jsonl
from longpack.core.errors import SettingsError
from longpack.pipeline.build import build
from longpack.pipeline.config import BuildConfig
from longpack.pipeline.manifest import summary
from longpack.pipeline.tokenize.kept import load_build_tokenizer


def tiny_build(tmp_path, tokenizer: str, out="out", seq=16, **kw) -> dict:
    src = tmp_path / "docs.jsonl"
    if not src.exists():  # once: a re-run over the same inputs resumes or finds it complete
        write_jsonl(src, [{"text": t} for t in make_texts(20)])
    return build(BuildConfig(out=str(tmp_path / out), dataset="jsonl", inputs=(str(src),),
                             tokenizer=tokenizer, seq=seq, **kw), show_progress=False)


def test_a_build_keeps_its_tokenizer_typed_relative_and_records_it_absolute(tmp_path,
                                                                          monkeypatch):
    (tmp_path / "toks").mkdir()
    ranks = write_byte_ranks(tmp_path / "toks" / "gpt2.tiktoken")
    monkeypatch.chdir(tmp_path / "toks")
    m = tiny_build(tmp_path, "gpt2.tiktoken")  # typed relative to this folder
    tok = m["tokenizer"]
    assert tok["file"] == "tokenizer.tiktoken" and tok["source"] == str(ranks)
    copy = tmp_path / "out" / "tokenizer.tiktoken"
    assert copy.read_bytes() == ranks.read_bytes()
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == tok["sha256"]
    assert "file" not in m["fingerprint"]["tokenizer"]  # the ids' meaning, not where it is kept


def test_a_tokenizer_json_build_keeps_tokenizer_json(tmp_path):
    pytest.importorskip("tokenizers")
    path = write_byte_tokenizer_json(tmp_path / "bytes-tokenizer.json")
    m = tiny_build(tmp_path, str(path))
    assert m["tokenizer"]["file"] == "tokenizer.json"
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == path.read_bytes()


def test_a_build_killed_before_its_manifest_resumes_with_its_copy(tmp_path, monkeypatch,
                                                                  byte_tokenizer):
    """The copy is claimed in the journal before it is written: after a kill between the copy
    and the manifest it is the build's own file, not a foreign one, and the re-run finishes."""
    import longpack.pipeline.pack.output as output

    def killed(path, *a, **kw):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(output, "write_json", killed)
        with pytest.raises(KeyboardInterrupt):
            tiny_build(tmp_path, byte_tokenizer)
    out = tmp_path / "out"
    assert (out / "tokenizer.tiktoken").is_file() and not (out / "manifest.json").exists()
    m = tiny_build(tmp_path, byte_tokenizer)
    assert m["tokenizer"]["file"] == "tokenizer.tiktoken" and m["timings"]["resumed"]
    # --overwrite removes it as the build's own, and writes it again
    m = tiny_build(tmp_path, byte_tokenizer, overwrite=True)
    assert (out / "tokenizer.tiktoken").read_bytes() == open(byte_tokenizer, "rb").read()


def test_a_file_named_like_the_copy_is_foreign_to_a_new_build(tmp_path, byte_tokenizer):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tokenizer.tiktoken").write_text("mine")
    with pytest.raises(SettingsError, match="tokenizer.tiktoken is not one of its files"):
        tiny_build(tmp_path, byte_tokenizer)
    assert (tmp_path / "out" / "tokenizer.tiktoken").read_text() == "mine"


def test_a_tokenizer_changed_during_the_build_is_refused(tmp_path, monkeypatch, byte_tokenizer):
    import longpack.pipeline.manifest as manifest_mod

    real = manifest_mod.keep_tokenizer

    def changed(tokenizer, out, claim):
        with open(byte_tokenizer, "ab") as f:
            f.write(b"YWI= 256\n")
        return real(tokenizer, out, claim)

    monkeypatch.setattr(manifest_mod, "keep_tokenizer", changed)
    from longpack.core.errors import TokenizerError

    with pytest.raises(TokenizerError, match="changed since it was loaded"):
        tiny_build(tmp_path, byte_tokenizer)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_zoo_loads_the_builds_copy_first_then_its_source(tmp_path, byte_tokenizer):
    """longpack/zoo/runs.py's (and any reader's) load_build_tokenizer."""

    m = tiny_build(tmp_path, byte_tokenizer)
    out = tmp_path / "out"
    os.rename(byte_tokenizer, tmp_path / "moved.tiktoken")  # the source is gone
    tok, problem = load_build_tokenizer(m["tokenizer"], out)
    assert problem is None and tok.name == m["tokenizer"]["name"]
    assert tok.sha256 == m["tokenizer"]["sha256"] and tok.eos_id == 50256
    assert tok.encode_batch(["ab"])[0].tolist() == [97, 98]
    (out / "tokenizer.tiktoken").write_bytes(b"YQ== 0\n")  # a damaged copy: not taken
    tok, problem = load_build_tokenizer(m["tokenizer"], out)
    assert tok is None and "another sha256" in problem and "not found" in problem
    shutil.copy(tmp_path / "moved.tiktoken", byte_tokenizer)  # the source is back: taken
    tok, problem = load_build_tokenizer(m["tokenizer"], out)
    assert problem is None and tok.sha256 == m["tokenizer"]["sha256"]


def test_a_build_of_before_the_copy_still_loads_from_its_source(tmp_path, byte_tokenizer):

    m = tiny_build(tmp_path, byte_tokenizer)
    old = {**m, "tokenizer": {k: v for k, v in m["tokenizer"].items() if k != "file"}}
    (tmp_path / "out" / "tokenizer.tiktoken").unlink()
    tok, problem = load_build_tokenizer(old["tokenizer"], tmp_path / "out")
    assert problem is None and tok.name == m["tokenizer"]["name"]
    os.unlink(byte_tokenizer)
    tok, problem = load_build_tokenizer(old["tokenizer"], tmp_path / "out")
    assert tok is None and "keeps no copy of its tokenizer" in problem


def test_a_tiny_seq_is_said_in_the_summary(tmp_path, byte_tokenizer):
    m = tiny_build(tmp_path, byte_tokenizer, seq=2)
    text = summary(m, "out")
    warning = [line for line in text.splitlines() if "warning" in line]
    assert len(warning) == 1 and "--seq 2:" in warning[0] and "rows of 2 tokens" in warning[0]
    assert "at most 2 tokens of context" in warning[0] and "--seq 2048" in warning[0]
    m = tiny_build(tmp_path, byte_tokenizer, out="wide", seq=64)
    assert "warning" not in summary(m, "wide")


def test_an_import_keeps_its_tokenizer_and_records_absolute_paths(tmp_path, monkeypatch,
                                                                  byte_tokenizer):
    import numpy as np

    from longpack.pipeline.adopt.config import ImportConfig
    from longpack.pipeline.adopt.import_tokens import import_tokens

    (tmp_path / "src").mkdir()
    np.save(tmp_path / "src" / "train.npy", np.arange(64, dtype=np.uint16).reshape(4, 16))
    monkeypatch.chdir(tmp_path)
    m = import_tokens(ImportConfig(src="src", out="imp", tokenizer=byte_tokenizer),
                      warn=lambda line: None)
    assert m["imported_from"] == str(tmp_path / "src")
    assert [i["path"] for i in m["inputs"]] == [str(tmp_path / "src" / "train.npy")]
    assert m["tokenizer"]["file"] == "tokenizer.tiktoken"
    assert (tmp_path / "imp" / "tokenizer.tiktoken").read_bytes() == open(
        byte_tokenizer, "rb").read()
    assert "source" not in m["fingerprint"]["tokenizer"]
    again = import_tokens(ImportConfig(src="src", out="imp", tokenizer=byte_tokenizer),
                          warn=lambda line: None)
    assert again == m  # the same import again: complete, nothing written
    assert json.loads((tmp_path / "imp" / "manifest.json").read_text()) == m


@pytest.mark.slow  # an S3 server, and torch (archs)
def test_a_build_in_a_bucket_keeps_its_tokenizer_and_the_zoo_fetches_it(tmp_path, monkeypatch,
                                                                       s3, byte_tokenizer):
    from longpack.core.store import Store
    from longpack.pipeline.distribute.launch import LaunchConfig, launch
    from longpack.zoo.runs import _build

    src = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in make_texts(20)])
    cfg = BuildConfig(out=s3.url("ds"), dataset="jsonl", inputs=(str(src),),
                      tokenizer=byte_tokenizer, seq=16, staging=str(tmp_path / "staging"))
    m = launch(cfg, LaunchConfig(), show_progress=False).manifest
    assert Store(s3.url("ds")).read_bytes("tokenizer.tiktoken") == open(byte_tokenizer,
                                                                        "rb").read()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    os.unlink(byte_tokenizer)
    folder, manifest = _build(s3.url("ds"))
    assert manifest["tokenizer"] == m["tokenizer"] and folder.is_relative_to(tmp_path / "cache")
    tok, problem = load_build_tokenizer(manifest["tokenizer"], folder)
    assert problem is None and tok.sha256 == m["tokenizer"]["sha256"]


def test_pack_stats_reads_token_texts_through_the_builds_copy(tmp_path):
    """The file the build read is gone: pack stats still shows token texts, from the copy."""
    from longpack.pipeline.stats.report import collect

    ranks = write_byte_ranks(tmp_path / "gpt2.tiktoken")
    tiny_build(tmp_path, str(ranks))
    ranks.unlink()
    report = collect(tmp_path / "out")
    assert not [n for n in report["checks"]["not_checked"] if n.startswith("token texts")]
    moved = tmp_path / "moved"
    shutil.move(tmp_path / "out", moved)
    (moved / "tokenizer.tiktoken").unlink()  # no copy and no source: said, not a traceback
    notes = collect(moved)["checks"]["not_checked"]
    assert any(n.startswith("token texts: the build's tokenizer cannot be loaded here") for n in notes)
