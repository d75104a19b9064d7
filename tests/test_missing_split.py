"""A build without a val split (what `pack import` of a folder without val/ writes) is a normal
state: pack stats reports it, train trains without a val loss and says so once, train --dry-run
plans it, zoo eval says what is missing; none of them tracebacks."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from test_train import config

from longpack.pipeline.cli import pack
from longpack.training.cli import train as train_cli
from longpack.training.loop import train
from longpack.zoo.cli import zoo


@pytest.fixture(params=["mds", "memmap"])
def train_only(tmp_path, request):
    """An imported build of one train split (ids < 256, no tokenizer, each row a document)."""
    src = tmp_path / "rows.npy"
    np.save(src, np.random.default_rng(0).integers(0, 256, (48, 65)).astype(np.int64))
    out = tmp_path / f"imported-{request.param}"
    result = CliRunner().invoke(pack, ["import", str(src), "--out", str(out), "--format",
                                       request.param])
    assert result.exit_code == 0, result.output
    assert list(json.loads((out / "manifest.json").read_text())["splits"]) == ["train"]
    return out


def test_pack_stats_reports_a_build_without_val(train_only):
    for extra in ([], ["--verify"]):
        result = CliRunner().invoke(pack, ["stats", str(train_only), *extra])
        assert result.exit_code == 0, result.output
        assert "checks                OK" in result.output
        assert "the build has no val split" in result.output
        assert "tokenizer imported ids (no tokenizer, vocabulary 256)" in result.output
    report = json.loads(CliRunner().invoke(pack, ["stats", str(train_only), "--json"]).output)
    assert list(report["splits"]) == ["train"] and report["checks"]["ok"]
    result = CliRunner().invoke(pack, ["stats", str(train_only), "--decode", "0", "--split", "val"])
    assert result.exit_code == 1 and "no split 'val' (has: train)" in result.output


def test_train_and_its_dry_run_go_on_without_val(tmp_path, train_only):
    lines = []
    history = train(config(train_only, tmp_path / "run", max_steps=3, eval_every=1, workers=0),
                    log=lines.append)
    assert len(history) == 3 and not any("val_loss" in r for r in history)
    said = [m for m in lines if "no val rows" in m]
    assert said == [f"{train_only.name}: the build has no val rows: the run reports no val loss "
                    "for it"]
    result = CliRunner().invoke(train_cli, ["--shards", str(train_only), "--out",
                                            str(tmp_path / "dry"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert f"  val         {train_only.name}: the build has no val rows" in result.output
    # zoo eval: the missing split in one line, naming the one there is; train evaluates
    result = CliRunner().invoke(zoo, ["eval", str(tmp_path / "run"), "--shards", str(train_only)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1] == (
        f"Error: {train_only} has no val rows (its splits with rows: train); pass --split train")
    result = CliRunner().invoke(zoo, ["eval", str(tmp_path / "run"), "--shards", str(train_only),
                                      "--split", "train", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rows"] == 48


def test_a_build_without_train_rows_is_refused_in_one_line(tmp_path, train_only):
    manifest = json.loads((train_only / "manifest.json").read_text())
    manifest["splits"] = {"val": {**manifest["splits"]["train"], "path": "train"}}
    (train_only / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(train_cli, ["--shards", str(train_only), "--out",
                                            str(tmp_path / "run"), "--max-steps", "1"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "the build has no train rows (manifest.json splits: val)" in result.output


@pytest.mark.slow
def test_a_build_whose_val_split_has_no_rows(tmp_path, byte_tokenizer):
    from conftest import make_texts, write_jsonl
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(40)])
    out = tmp_path / "no-val"
    build(BuildConfig(out=str(out), dataset="jsonl", inputs=(str(tmp_path / "d.jsonl"),),
                      tokenizer=byte_tokenizer, seq=65, val_fraction=0.0), show_progress=False)
    assert json.loads((out / "manifest.json").read_text())["splits"]["val"]["rows"] == 0
    result = CliRunner().invoke(pack, ["stats", str(out), "--verify"])
    assert result.exit_code == 0, result.output
    assert "vocab (val)           no tokens" in result.output
    assert "not checked: val: no rows (the build made none: --val-fraction 0" in result.output
    assert "None" not in result.output
    lines = []
    train(config(out, tmp_path / "run", max_steps=2, warmup=0, eval_every=1, workers=0),
          log=lines.append)
    assert [m for m in lines if "no val rows" in m] == [
        "no-val: the build has no val rows: the run reports no val loss for it"]


def test_pack_stats_says_when_val_is_too_small_to_measure(tmp_path, byte_tokenizer):
    """A val split of a row or two gives a val loss of noise: pack stats says so (issue 44)."""
    from conftest import write_jsonl
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    write_jsonl(tmp_path / "d.jsonl", [{"text": f"document {i}: a few words."} for i in range(400)])
    out = tmp_path / "small-val"
    build(BuildConfig(out=str(out), dataset="jsonl", inputs=(str(tmp_path / "d.jsonl"),),
                      tokenizer=byte_tokenizer, seq=65, val_fraction=0.01), show_progress=False)
    rows = json.loads((out / "manifest.json").read_text())["splits"]["val"]["rows"]
    assert 0 < rows < 8
    result = CliRunner().invoke(pack, ["stats", str(out)])
    assert result.exit_code == 0, result.output
    assert f"not checked: val: {rows} row" in result.output
    assert "a val loss over fewer than 8 rows is noise" in result.output
