"""End-to-end builds of the real shared corpus (../shared) with the GPT-2 tokenizer; where a test
needs only some real text (`corpus`), the sample shipped with the package stands in without it."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import zstandard

from conftest import Corpus, split_documents
from longpack.core.errors import InputError
from longpack.pipeline.build import build
from longpack.pipeline.config import WORK_DIR, BuildConfig
from longpack.pipeline.tokenize.tokenizer import load_tokenizer

EOS = 50256


def fineweb_texts(shared):
    files = sorted(str(p) for p in (shared / "data/fineweb-edu-sample").glob("*.parquet"))
    return [t for f in files for t in pq.read_table(f, columns=["text"]).column("text").to_pylist()]


def dolma_texts(shared):
    texts = []
    for f in sorted(str(p) for p in (shared / "data/dolma-sample").iterdir()):
        raw = Path(f).read_bytes()
        raw = gzip.decompress(raw) if f.endswith(".gz") else zstandard.ZstdDecompressor(
        ).stream_reader(raw).read()
        texts += [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
    return texts


def gpt2(shared):
    return str(shared / "tokenizers/gpt2.tiktoken")


def pack_cmd(corpus: Corpus, out, *extra):
    pack = str(Path(sys.executable).parent / "pack")
    return [pack, "build", "--dataset", "fineweb-edu", "--input",
            str(corpus.data("fineweb-edu-sample")), "--tokenizer",
            str(corpus.tokenizer("gpt2.tiktoken")), "--seq", "32768",
            "--out", str(out), "--val-fraction", "0.01", "--quiet", *extra]


# Counts from shared/data/README.md; 27 of the .zst file's 697 documents have empty text.
@pytest.mark.parametrize("dataset,texts_of,docs,text_tokens,empty", [
    # fineweb-edu's 7.3 M tokens take ~6 s: the whole suite's; dolma's 1.2 M the quick loop's
    pytest.param("fineweb-edu", fineweb_texts, 3558, 7_270_827, 0, marks=pytest.mark.slow),
    ("dolma", dolma_texts, 727 - 27, 21_804 + 12_845 + 14_388 + 1_174_311, 27)])
def test_real_corpus_round_trips_exactly(tmp_path, shared, dataset, texts_of, docs, text_tokens,
                                         empty):
    folder = {"fineweb-edu": "fineweb-edu-sample", "dolma": "dolma-sample"}[dataset]
    cfg = BuildConfig(out=str(tmp_path / "out"), dataset=dataset,
                      inputs=(str(shared / "data" / folder),), tokenizer=gpt2(shared),
                      seq=32768, val_fraction=0.01)
    m = build(cfg, show_progress=False)
    assert m["counts"]["documents"] == docs and m["counts"]["tokens"] == text_tokens + docs
    assert m["counts"]["skipped"]["empty"] == empty == sum(m["counts"]["skipped"].values())
    tok = load_tokenizer(gpt2(shared))
    got = {s: [tok.decode(d[:-1]) for d in split_documents(tmp_path / "out", s, EOS)]
           for s in ("train", "val")}
    assert len(got["val"]) == m["splits"]["val"]["documents"] > 0
    assert not set(got["train"]) & set(got["val"])
    texts = [t for t in texts_of(shared) if t]
    in_val = set(got["val"])
    # every document once, exactly; in the packing's order (best-fit, the default: each window
    # longest first), not the input's (concat's input order: test_build.py)
    assert m["settings"]["packing"] == "best-fit"
    assert sorted(got["train"]) == sorted(t for t in texts if t not in in_val)
    assert sorted(got["val"]) == sorted(t for t in texts if t in in_val)


@pytest.mark.slow
def test_real_build_is_identical_for_1_and_2_workers(tmp_path, real_text):
    for w in (1, 2):
        subprocess.run(pack_cmd(real_text, tmp_path / f"w{w}", "--workers", str(w),
                                "--format", "memmap"), check=True, timeout=300)
    files = sorted(p.relative_to(tmp_path / "w1") for p in (tmp_path / "w1").rglob("*.npy"))
    assert len(files) >= 4
    for f in files:
        assert (tmp_path / "w1" / f).read_bytes() == (tmp_path / "w2" / f).read_bytes()


@pytest.mark.slow
def test_build_killed_with_sigkill_resumes_to_identical_output(tmp_path, shared):
    whole = Corpus(shared, shipped=False)  # the whole corpus: the shipped sample is too short
    small_shards = ["--shard-bytes", str(4 * 32768 * 2)]
    subprocess.run(pack_cmd(whole, tmp_path / "clean", *small_shards), check=True, timeout=300)
    out = tmp_path / "killed"
    proc = subprocess.Popen(pack_cmd(whole, out, "--workers", "1", *small_shards))
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if (out / WORK_DIR / "checkpoint.npz").exists() and len(
                list((out / "train").glob("shard.*"))) >= 10:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed"
    assert not (out / "manifest.json").exists() and not (out / "train" / "index.json").exists()
    subprocess.run(pack_cmd(whole, out, *small_shards), check=True, timeout=300)
    m = json.loads((out / "manifest.json").read_text())
    assert m["timings"]["resumed"] and m["timings"]["tokens_this_run"] < m["counts"]["tokens"]
    for p in sorted((tmp_path / "clean").rglob("*")):
        if p.is_file() and p.name != "manifest.json":
            assert (out / p.relative_to(tmp_path / "clean")).read_bytes() == p.read_bytes(), p


def test_huggingface_tokenizer_build_of_dolma(tmp_path, shared):
    pytest.importorskip("tokenizers")
    path = str(shared / "tokenizers/gpt-neox-tokenizer.json")
    m = build(BuildConfig(out=str(tmp_path / "o"), dataset="dolma", tokenizer=path, seq=8192,
                          inputs=(str(shared / "data/dolma-sample"),), val_fraction=0.0,
                          packing="concat"),  # the input's order: its first documents first
              show_progress=False)
    tok = load_tokenizer(path)
    docs = split_documents(tmp_path / "o", "train", tok.eos_id)
    assert len(docs) == m["counts"]["documents"] == 700 and m["dtype"] == "uint16"
    texts = [t for t in dolma_texts(shared) if t]
    # The tokenizer's NFC normalizer is the only change a round trip may show.
    import unicodedata
    assert [tok.decode(d[:-1]) for d in docs[:50]] == [
        unicodedata.normalize("NFC", t) for t in texts[:50]]
    assert np.concatenate(docs).max() < tok.vocab_size


@pytest.mark.slow
def test_damaged_real_files_are_counted_and_the_rest_is_kept(tmp_path, shared):
    import shutil

    d = tmp_path / "dolma"
    shutil.copytree(shared / "data/dolma-sample", d)
    gz = d / "cc_en_head-0091.jsonl.gz"
    data = gz.read_bytes()
    gz.write_bytes(data[: len(data) // 2])
    complete = []
    try:
        with gzip.open(gz, "rt") as f:
            for line in f:
                if line.endswith("\n"):
                    complete.append(json.loads(line)["text"])
    except EOFError:
        pass
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"PAR1" + b"\0" * 100)
    m = build(BuildConfig(out=str(tmp_path / "o"), dataset="dolma", tokenizer=gpt2(shared),
                          inputs=(str(d), str(junk)), seq=4096, val_fraction=0.0),
              show_progress=False)
    assert m["counts"]["skipped"]["truncated_file"] == 1
    assert m["counts"]["skipped"]["corrupt_file"] == 1
    assert m["counts"]["documents"] == 700 - 10 + len(complete)
    log = [json.loads(x) for x in (tmp_path / "o/skipped.jsonl").read_text().splitlines()]
    assert {(e["reason"], Path(e["file"]).name) for e in log if e["reason"] != "empty"} == {
        ("truncated_file", gz.name), ("corrupt_file", "junk.parquet")}
    with pytest.raises(InputError, match=r"cc_en_head-0091\.jsonl\.gz, line \d+: truncated_file"):
        build(BuildConfig(out=str(tmp_path / "o2"), dataset="dolma", tokenizer=gpt2(shared),
                          inputs=(str(gz),), seq=4096, on_error="fail"), show_progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["neox-tiny", "mamba-tiny"])
def test_loss_falls_training_on_the_real_corpus(tmp_path, real_text, model):
    from longpack.training.config import TrainConfig
    from longpack.training.loop import train

    out = tmp_path / "mds"
    build(BuildConfig(out=str(out), dataset="fineweb-edu",
                      inputs=(str(real_text.data("fineweb-edu-sample")),),
                      tokenizer=str(real_text.tokenizer("gpt2.tiktoken")), seq=129,
                      val_fraction=0.05,
                      max_tokens=300_000), show_progress=False)
    history = train(TrainConfig(shards=str(out), model=model, out=str(tmp_path / "run"),
                                batch_size=4, max_steps=40, warmup=5, lr=3e-3, save_every=40,
                                eval_every=40, eval_batches=2), log=lambda m: None)
    first, last = history[0]["loss"], sum(h["loss"] for h in history[-5:]) / 5
    assert first > 10 and last < 0.75 * first  # from ln(50257) ~ 10.8 towards English text
    assert history[-1]["val_loss"] < 0.8 * first
