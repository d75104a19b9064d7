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




def test_a_path_is_text_or_a_path_each_item_of_a_list_too(tmp_path):
    """A number where a path goes was a folder of that name (before: shards=123 read
    ./123/manifest.json, inputs=[5] looked for a file 5): every path of every config the
    functions take, alone or in a list, is refused naming the keyword and the item."""
    import dataclasses

    from longpack.pipeline import BuildConfig, ImportConfig, LaunchConfig
    from longpack.training import TrainConfig
    from longpack.zoo import ExportConfig

    here = str(tmp_path)
    for call, says in (
            (lambda: longpack.train(shards=[here, 5]), r"^train: shards\[1\]=5: give each of "
                                                       r"shards as text or a Path$"),
            (lambda: longpack.plan(shards=(tmp_path, 2.5)), r"^train: shards\[1\]=2.5"),
            (lambda: longpack.build(out=tmp_path / "o", dataset="jsonl", inputs=[5]),
             r"^pack build: inputs\[0\]=5: give each of inputs as text or a Path$"),
            (lambda: longpack.build(out=tmp_path / "o", dataset="jsonl", inputs=[here, None]),
             r"^pack build: inputs\[1\]=None")):
        with pytest.raises(SettingsError, match=says):
            call()
    calls = {TrainConfig: lambda **kw: longpack.train(**{"shards": here, **kw}),
             BuildConfig: lambda **kw: longpack.build(**{"out": tmp_path / "o", **kw}),
             ImportConfig: lambda **kw: longpack.import_tokens(**{"src": here, "out": here, **kw}),
             ExportConfig: lambda **kw: longpack.export(**{"run": here, "out": here, **kw}),
             LaunchConfig: None}  # where a build runs: no path
    paths = {cls: {f.name for f in dataclasses.fields(cls) if f.metadata.get("path")}
             for cls in calls}
    assert paths[TrainConfig] == {"shards", "init_from", "out", "upload", "staging", "cache"}
    assert paths[BuildConfig] == {"out", "inputs", "tokenizer", "staging"}
    assert paths[ImportConfig] == {"src", "out", "tokenizer"}
    assert paths[ExportConfig] == {"run", "out", "shards"} and not paths[LaunchConfig]
    command = {TrainConfig: "train", BuildConfig: "pack build", ImportConfig: "pack import",
               ExportConfig: "zoo export"}
    for cls, names in paths.items():
        for name in names:
            with pytest.raises(SettingsError, match=rf"^{command[cls]}: {name}=7: give {name} "
                                                    r"as text or a Path$"):
                calls[cls](**{name: 7})
    with pytest.raises(LongpackError, match="manifest.json not found"):  # a Path is a path
        longpack.plan(shards=[tmp_path / "a"], log=lambda line: None)
    assert not (tmp_path / "o").exists()


def test_a_rule_tying_settings_names_the_keywords(tmp_path):
    """What ties settings together is written once, with the flags (training/config.py's
    rules, BuildConfig's, LaunchConfig's, the zoo's); from Python it says the keywords, with
    the values where it gives them (before: --min-lr 1.0 is above --lr 0.0003), and the
    command line still says the flags."""
    from longpack.training.cli import train as train_cli

    out = tmp_path / "o"
    for call, says in (
            (lambda: longpack.train(shards="x", min_lr=1.0), "train: min_lr=1.0 is above "
                                                             "lr=0.0003"),
            (lambda: longpack.plan(shards="x", model_args=["d_model=x"]),
             "train: model_args: d_model: 'x' is not a int"),
            (lambda: longpack.train(shards="x", fsdp_replicas=2),
             "train: fsdp_replicas is hybrid sharding: it needs fsdp=True"),
            (lambda: longpack.train(shards="x", schedule="cosine", restart_every=5),
             "train: schedule='cosine-restarts' takes restart_every STEPS"),
            (lambda: longpack.train(shards="x", upload="here"),
             "train: upload='here': give a bucket's URL"),
            (lambda: longpack.train(shards="x", mix_stages=["soon"]),
             "train: mix_stages 'soon': give START:NAME=WEIGHT"),
            (lambda: longpack.build(out=out, tasks=2, task_index=5),
             "pack build: task_index=5 is not a task of tasks=2 (0 to 1)"),
            (lambda: longpack.build(out=out, last_row="drop"),
             "pack build: last_row='drop' drops the one partial row of packing='concat'"),
            (lambda: longpack.build(out=out, format="memmap", compression="zstd"),
             "pack build: memmap shards are uncompressed .npy files: drop compression (or use "
             "format='mds')"),
            (lambda: longpack.build(out=out, wait=True),
             "pack build: slurm_option, wait=True and dry_run=True need engine='slurm'"),
            (lambda: longpack.export(tmp_path, out, to="safetensors", tokenizer=False),
             "zoo export: tokenizer=False and shards are to hf's: to='safetensors' writes")):
        with pytest.raises(SettingsError) as e:
            call()
        assert str(e.value).startswith(says) and "--" not in str(e.value), str(e.value)
    r = CliRunner().invoke(train_cli, ["--shards", "x", "--min-lr", "1.0", "--dry-run"])
    assert r.exit_code == 1 and "Error: --min-lr 1.0 is above --lr 0.0003\n" in r.output, r.output
    r = CliRunner().invoke(pack, ["build", "--out", str(out), "--last-row", "drop"])
    assert r.exit_code == 1 and "Error: --last-row drop drops" in r.output, r.output
    assert not out.exists()


def test_plan_is_the_dry_run(tmp_path, shards):
    lines = []
    p = longpack.plan(shards=str(shards), model="neox-tiny", batch_size=2, world_size=8,
                      log=lines.append)
    assert p["world_size"] == 8 and p["tokens_per_step"] == 16 * p["seq"]
    assert p["fits"] and p["probe_skipped"]
    assert lines[0].startswith("train --dry-run: nothing is trained\n")
    with pytest.raises(SettingsError, match=r"did you mean batch_size\?"):
        longpack.plan(shards=str(shards), batchsize=2)
