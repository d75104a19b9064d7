"""longpack's Python API (longpack/api.py): the commands as functions, with their settings as
keyword arguments and their errors as exceptions; the same bytes as the commands."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

import longpack
from conftest import make_texts, write_jsonl
from longpack import LongpackError, SettingsError
from longpack.pipeline.cli import pack


def corpus(tmp_path):
    return str(write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(120)]))


def test_build_and_stats_are_the_commands(tmp_path, byte_tokenizer):
    settings = dict(dataset="jsonl", inputs=[corpus(tmp_path)], tokenizer=byte_tokenizer,
                    seq=64, val_fraction=0.1)
    manifest = longpack.build(out=tmp_path / "api", **settings)  # a Path, as a user passes it
    r = CliRunner().invoke(pack, ["build", "--out", str(tmp_path / "cli"), "--dataset", "jsonl",
                                  "--input", settings["inputs"][0], "--tokenizer", byte_tokenizer,
                                  "--seq", "64", "--val-fraction", "0.1", "--quiet"])
    assert r.exit_code == 0, r.output
    assert manifest == json.loads((tmp_path / "api" / "manifest.json").read_text())
    for split in ("train", "val"):
        for f in sorted((tmp_path / "cli" / split).iterdir()):
            assert (tmp_path / "api" / split / f.name).read_bytes() == f.read_bytes()
    # complete already: the manifest again, nothing written
    assert longpack.build(out=str(tmp_path / "api"), **settings) == manifest
    report = longpack.stats(tmp_path / "api", verify=True)
    assert report["checks"]["ok"] is True
    assert report["splits"]["train"]["rows"] == manifest["splits"]["train"]["rows"]


def test_errors_are_exceptions_naming_the_fix(tmp_path, byte_tokenizer):
    with pytest.raises(SettingsError, match=r"pack build: unknown setting sequence \(did you "
                                            r"mean seq\?\)"):
        longpack.build(out=str(tmp_path / "o"), sequence=64)
    with pytest.raises(SettingsError, match=r"train: unknown setting max_step \(did you mean "
                                            r"max_steps\?\)"):
        longpack.train(shards=str(tmp_path), max_step=3)
    with pytest.raises(LongpackError, match="no such directory"):
        longpack.stats(tmp_path / "missing")
    with pytest.raises(LongpackError, match="manifest.json not found"):
        longpack.train(shards=str(tmp_path / "missing"), out=str(tmp_path / "run"))
    # named as the caller wrote them (before: the flag, --val-fraction = 'x' ...)
    for bad, says in ((dict(seq="2048"), "^pack build: seq = '2048' is not a whole number"),
                      (dict(seq=True), "^pack build: seq = True is not a whole number"),
                      (dict(inputs={"a": 1}), "give a list"),
                      (dict(val_fraction="x"), "^pack build: val_fraction = 'x' is not a number"),
                      (dict(seq=-3), "^pack build: seq must be at least 2")):
        with pytest.raises(SettingsError, match=says):
            longpack.build(out=tmp_path / "o", **bad)
    with pytest.raises(SettingsError, match=r"^pack build: out=123: give out as text or a Path"):
        longpack.build(out=123)  # before: a build in ./123
    with pytest.raises(SettingsError, match=r"^train: out=1.5: give out as text or a Path"):
        longpack.train(shards=str(tmp_path), out=1.5)
    with pytest.raises(SettingsError, match="path=None: give path as text or a Path"):
        longpack.stats(None)
    assert not (tmp_path / "o").exists() and not (tmp_path / "run").exists()


def test_import_tokens(tmp_path):
    rows = np.arange(4 * 16, dtype=np.uint16).reshape(4, 16)
    np.save(tmp_path / "train.npy", rows)
    (tmp_path / "src").mkdir()
    (tmp_path / "train.npy").rename(tmp_path / "src" / "train.npy")
    manifest = longpack.import_tokens(tmp_path / "src", tmp_path / "out", format="memmap")
    assert manifest["splits"]["train"]["rows"] == 4 and manifest["seq"] == 16
    with pytest.raises(SettingsError, match=r"did you mean format\?"):
        longpack.import_tokens(tmp_path / "src", tmp_path / "out2", formats="memmap")


@pytest.mark.slow
def test_train_then_export(tmp_path, shards, capsys):
    history = longpack.train(shards=str(shards), out=str(tmp_path / "run"), model="neox-tiny",
                             max_steps=3, warmup=1, batch_size=2, workers=0)
    assert [h["step"] for h in history] == [0, 1, 2]
    printed = capsys.readouterr().out  # by default the console's lines, as `train` says them
    assert "training neox-tiny" in printed and "step 0" in printed
    lines = []
    longpack.train(shards=str(shards), out=str(tmp_path / "run"), model="neox-tiny",
                   max_steps=4, warmup=1, batch_size=2, workers=0, log=lines.append)
    assert any("resumed from" in line for line in lines)
    assert longpack.export(tmp_path / "run", tmp_path / "st", to="safetensors") == []
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["config.json",
                                                                  "model.safetensors"]
    with pytest.raises(LongpackError, match="is not empty"):
        longpack.export(tmp_path / "run", tmp_path / "st", to="safetensors")


def test_what_the_commands_refuse_the_functions_refuse_in_one_line(tmp_path, shards):
    """Each was a TypeError from deep inside, or a report of negative seconds."""
    for call, says in (
            (lambda: longpack.build(dataset="jsonl", inputs=["x"]), "pack build needs out=..."),
            (lambda: longpack.train(max_steps=1), "train needs shards=..."),
            (lambda: longpack.train(shards=str(shards), resume=5),
             "resume=5: give resume as text or a Path"),
            (lambda: longpack.train(shards=str(shards), log=5), "log=5: give a function"),
            (lambda: longpack.import_tokens("s", "o", warn=5), "warn=5: give a function"),
            (lambda: longpack.stats(shards, throughput="fast"),
             "pack stats: throughput = 'fast' is not a number"),
            (lambda: longpack.stats(shards, throughput=-1.0),
             "pack stats: throughput must be positive and finite (got -1.0)"),
            (lambda: longpack.stats(shards, budget=float("nan")),
             "pack stats: budget must be positive and finite (got nan)"),
            (lambda: longpack.stats(shards, verify="no"),
             "pack stats: verify = 'no' is not true or false"),
            (lambda: longpack.merge(tmp_path / "a-file"), "holds no build split into tasks")):
        (tmp_path / "a-file").write_text("x")
        with pytest.raises(SettingsError) as e:
            call()
        assert says in str(e.value), str(e.value)
    assert longpack.stats(shards, throughput=1e6)["checks"]["ok"]


def test_every_unknown_keyword_is_named_at_once():
    # as a config file's keys are: each with the nearest known name when one is close
    with pytest.raises(SettingsError, match=r"train: unknown settings batchsize \(did you mean "
                                            r"batch_size\?\), learning_rate \(it is lr: the "
                                            r"peak learning rate\)$"):  # training/names.py
        longpack.train(shards="x", out="o", learning_rate=1e-3, batchsize=4)




def test_plan_is_the_dry_run(tmp_path, shards):
    lines = []
    p = longpack.plan(shards=str(shards), model="neox-tiny", batch_size=2, world_size=8,
                      log=lines.append)
    assert p["world_size"] == 8 and p["tokens_per_step"] == 16 * p["seq"]
    assert p["fits"] and p["probe_skipped"]
    assert lines[0].startswith("train --dry-run: nothing is trained\n")
    with pytest.raises(SettingsError, match=r"did you mean batch_size\?"):
        longpack.plan(shards=str(shards), batchsize=2)
