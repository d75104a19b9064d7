"""A build's tokenizer is part of its identity (issue 52). A build's copy of its tokenizer that
is missing or not of its manifest's sha256 is a problem for `pack stats` (text, --json,
--verify: exit 1), and --decode does not decode with it. A run holds every build it meets to
the tokenizer its checkpoints recorded, whatever the build folder now holds (another build, or
its copy replaced): `train --resume`, `zoo export`, `generate` and `eval` refuse it in one line
naming both sha256s; `zoo export --no-tokenizer` still exports the model alone, and
`--shards` names where a moved build is now."""

import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from test_train import config

from conftest import SAMPLES, make_texts, small_build, write_byte_tokenizer_json, write_jsonl
from longpack.pipeline.build import build
from longpack.pipeline.cli import pack
from longpack.pipeline.config import BuildConfig
from longpack.training.cli import train as train_cli
from longpack.training.loop import train
from longpack.zoo.cli import zoo

GPT2 = SAMPLES / "gpt2.tiktoken"  # GPT-2's own ranks file, shipped with the package


def swap_two_ids(ranks: bytes) -> bytes:
    """A ranks file whose first two tokens trade ids: the same vocabulary, each text of those
    bytes another id (another tokenizer that loads like the real one)."""
    lines = ranks.split(b"\n")
    (a, rank_a), (b, rank_b) = lines[0].split(b" "), lines[1].split(b" ")
    lines[0], lines[1] = a + b" " + rank_b, b + b" " + rank_a
    return b"\n".join(lines)


def flip_a_byte(data: bytes) -> bytes:
    at = len(data) // 2
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]


def error_line(result) -> str:
    """Exit 1, no traceback, and one `Error:` line, which is returned."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), (
        repr(result.exception), result.output)
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def sha(build: Path) -> str:
    return json.loads((build / "manifest.json").read_text())["tokenizer"]["sha256"][:12]


# -- pack stats ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2_build(tmp_path_factory) -> Path:
    """A small build of GPT-2's ranks file (its copy: OUT/tokenizer.tiktoken), once a module."""
    tmp = tmp_path_factory.mktemp("gpt2-build")
    src = write_jsonl(tmp / "docs.jsonl", [{"text": t} for t in make_texts(20)])
    build(BuildConfig(out=str(tmp / "out"), dataset="jsonl", inputs=(str(src),),
                      tokenizer=str(GPT2), seq=16), show_progress=False)
    return tmp / "out"


DAMAGE = {"removed": lambda path: path.unlink(),
          "a byte changed": lambda path: path.write_bytes(flip_a_byte(path.read_bytes())),
          "gpt2 with two ids swapped": lambda path: path.write_bytes(
              swap_two_ids(GPT2.read_bytes()))}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_pack_stats_lists_a_missing_or_changed_tokenizer_copy(tmp_path, gpt2_build, damage):
    out = Path(shutil.copytree(gpt2_build, tmp_path / "out"))
    DAMAGE[damage](out / "tokenizer.tiktoken")
    want = "missing" if damage == "removed" else "its sha256 is "
    runner = CliRunner()
    for more in ([], ["--verify"]):
        r = runner.invoke(pack, ["stats", str(out), *more])
        assert r.exit_code == 1 and "1 PROBLEMS" in r.output, r.output
        named = [line.strip() for line in r.output.splitlines() if "tokenizer.tiktoken" in line]
        assert len(named) == 1 and named[0].startswith(f"tokenizer.tiktoken: {want}"), named
        assert sha(out) in named[0]  # the file to put back, by its sha256
    r = runner.invoke(pack, ["stats", str(out / "train"), "--json"])  # a split: its build's copy
    report = json.loads(r.output)
    assert r.exit_code == 1 and not report["checks"]["ok"]
    assert [p["file"] for p in report["checks"]["problems"]] == ["tokenizer.tiktoken"]
    line = error_line(runner.invoke(pack, ["stats", str(out), "--decode", "0"]))
    assert line.startswith(f"Error: --decode {out}: tokenizer.tiktoken: {want}")
    if damage == "removed":  # a build of before the copy (its manifest names none): as before
        manifest = json.loads((out / "manifest.json").read_text())
        del manifest["tokenizer"]["file"]
        (out / "manifest.json").write_text(json.dumps(manifest))
        r = runner.invoke(pack, ["stats", str(out), "--verify"])
        assert r.exit_code == 0 and re.search(r"checks +OK", r.output), r.output
        r = runner.invoke(pack, ["stats", str(out), "--decode", "0"])
        assert r.exit_code == 0 and r.output.startswith("train row 0: 16 tokens"), r.output


@pytest.mark.slow  # an S3 server
def test_a_build_in_a_bucket_has_its_tokenizer_copy_checked_too(s3, gpt2_build):
    url = s3.upload_tree(gpt2_build, "build")
    runner = CliRunner()
    assert runner.invoke(pack, ["stats", url]).exit_code == 0
    s3.client.put_object(Bucket=s3.name, Key="build/tokenizer.tiktoken",
                         Body=swap_two_ids(GPT2.read_bytes()))
    r = runner.invoke(pack, ["stats", url, "--json"])
    problems = json.loads(r.output)["checks"]["problems"]
    assert r.exit_code == 1 and [p["file"] for p in problems] == ["tokenizer.tiktoken"]
    assert problems[0]["what"].startswith("its sha256 is ")
    line = error_line(runner.invoke(pack, ["stats", url, "--decode", "0"]))
    assert line.startswith(f"Error: --decode {url}: tokenizer.tiktoken: its sha256 is ")


# -- a run and the builds it meets -------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory, shards_once):
    """A 2-step run on its own copy of `shards` (`build`, its byte-level tokenizer.json), and
    `other`: the same documents built with that tokenizer.json with two ids swapped (the same
    name and vocabulary, another sha256)."""
    tmp = tmp_path_factory.mktemp("identity")
    build_dir = Path(shutil.copytree(shards_once, tmp / "build"))
    run = tmp / "run"
    train(config(build_dir, run, max_steps=2, save_every=2, workers=0), log=lambda m: None)
    (tmp / "swapped").mkdir()
    tok = write_byte_tokenizer_json(tmp / "swapped" / "bytes-tokenizer.json")
    spec = json.loads(tok.read_text())
    vocab = spec["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    tok.write_text(json.dumps(spec))
    other = small_build(tmp / "swapped", tok, "mds", 200, seed=0, val_fraction=0.05)
    return SimpleNamespace(build=build_dir, run=run, other=other, moved=tmp / "moved")


@pytest.fixture(params=["build replaced", "copy replaced"])
def replaced(request, trained):
    """The run's build folder holding another tokenizer: another build in its place, or the
    build with its copy of the tokenizer replaced by another's; the build itself is at
    `trained.moved` meanwhile."""
    os.rename(trained.build, trained.moved)
    try:
        if request.param == "build replaced":
            shutil.copytree(trained.other, trained.build)
        else:
            shutil.copytree(trained.moved, trained.build)
            shutil.copyfile(trained.other / "tokenizer.json", trained.build / "tokenizer.json")
        yield trained
    finally:
        shutil.rmtree(trained.build, ignore_errors=True)
        os.rename(trained.moved, trained.build)


def test_a_run_records_the_sha256_of_its_tokenizer(trained):
    """In its checkpoints (what resume and the zoo hold builds to) and its resolved config
    (W&B's run config)."""
    import torch

    from longpack import archs
    from longpack.training.loop import resolved_config

    want = json.loads((trained.build / "manifest.json").read_text())["tokenizer"]
    state = torch.load(trained.run / "step-00000002" / "state.pt", weights_only=False)
    assert state["tokenizer"]["sha256"] == want["sha256"]
    cfg = config(trained.build, trained.run)
    record = resolved_config(cfg, archs.build("neox-tiny", vocab_size=257),
                             SimpleNamespace(seq=65, manifest={"tokenizer": want}), 1,
                             SimpleNamespace(global_batch=4), 4 * 64)
    assert record["tokenizer"] == {"name": "bytes-tokenizer", "sha256": want["sha256"],
                                   "vocab_size": 257, "eos_id": 256}


def names_both(line: str, trained) -> None:
    assert sha(trained.moved) in line and sha(trained.other) in line, line


def test_resume_refuses_a_build_of_another_tokenizer(tmp_path, replaced):
    run = Path(shutil.copytree(replaced.run, tmp_path / "run"))  # were it resumed, not the module's
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    r = CliRunner().invoke(train_cli, ["--shards", str(replaced.build), "--out", str(run),
                                       "--model", "neox-tiny", "--batch-size", "4",
                                       "--max-steps", "4", "--workers", "0"])
    line = error_line(r)
    names_both(line, replaced)
    assert "step-00000002" in line and "--shards" in line and "--resume never" in line
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_zoo_export_and_generate_refuse_a_build_of_another_tokenizer(tmp_path, replaced):
    runner = CliRunner()
    out = tmp_path / "hf"
    line = error_line(runner.invoke(zoo, ["export", str(replaced.run), "--to", "hf", "--out",
                                          str(out)]))
    names_both(line, replaced)
    assert "--shards" in line and "--no-tokenizer" in line and not out.exists()
    line = error_line(runner.invoke(zoo, ["generate", str(replaced.run), "--prompt", "ab"]))
    names_both(line, replaced)
    assert "--shards" in line


def test_zoo_eval_refuses_a_build_whose_copy_is_another_tokenizer(trained):
    """Another build in the folder is refused by its manifest (tests/test_zoo_refusals.py); a
    copy of another tokenizer in the run's own build, by the copy."""
    original = (trained.build / "tokenizer.json").read_bytes()
    shutil.copyfile(trained.other / "tokenizer.json", trained.build / "tokenizer.json")
    try:
        line = error_line(CliRunner().invoke(zoo, ["eval", str(trained.run), "--shards",
                                                   str(trained.build)]))
    finally:
        (trained.build / "tokenizer.json").write_bytes(original)
    assert sha(trained.build) in line and sha(trained.other) in line, line
    assert str(trained.build / "tokenizer.json") in line
    assert line.endswith("evaluate on a build of the run's tokenizer")


@pytest.mark.slow  # two exports (transformers' tokenizer files, the model card)
def test_a_moved_build_is_named_with_shards(tmp_path, trained):
    pytest.importorskip("transformers")
    runner = CliRunner()
    os.rename(trained.build, trained.moved)
    try:
        r = runner.invoke(zoo, ["export", str(trained.run), "--to", "hf", "--out",
                                str(tmp_path / "hf"), "--shards", str(trained.moved)])
        assert r.exit_code == 0, r.output
        assert ((tmp_path / "hf" / "tokenizer.json").read_bytes()
                == (trained.moved / "tokenizer.json").read_bytes())
        r = runner.invoke(zoo, ["generate", str(trained.run), "--prompt", "ab",
                                "--max-new-tokens", "4", "--shards", str(trained.moved)])
        assert r.exit_code == 0 and r.output.startswith("ab"), r.output
        # --shards is held to the recorded tokenizer too
        line = error_line(runner.invoke(zoo, ["export", str(trained.run), "--to", "hf", "--out",
                                              str(tmp_path / "o"), "--shards",
                                              str(trained.other)]))
        assert f"{trained.other} is a build of bytes-tokenizer (sha256 " in line
        assert sha(trained.moved) in line and sha(trained.other) in line
        assert not (tmp_path / "o").exists()
    finally:
        os.rename(trained.moved, trained.build)


@pytest.mark.slow  # exports (the model card), a copy of the run
def test_no_tokenizer_and_old_checkpoints_still_export(tmp_path, replaced):
    """--no-tokenizer exports the model alone; a checkpoint of before the recorded tokenizer
    has nothing to hold a build to: it exports as it did."""
    pytest.importorskip("transformers")
    import torch

    from longpack.training.checkpoints import checkpoint

    runner = CliRunner()
    r = runner.invoke(zoo, ["export", str(replaced.run), "--to", "hf", "--out",
                            str(tmp_path / "alone"), "--no-tokenizer"])
    assert r.exit_code == 0 and "note: no tokenizer written" in r.output, r.output
    assert not (tmp_path / "alone" / "tokenizer.json").exists()
    assert (tmp_path / "alone" / "config.json").is_file()
    old = Path(shutil.copytree(replaced.run, tmp_path / "old")) / "step-00000002"
    state = torch.load(old / "state.pt", weights_only=False)
    del state["tokenizer"]
    torch.save(state, old / "state.pt")
    (old / "COMPLETE").write_text(checkpoint.sha256_file(old / "state.pt") + "\n")
    r = runner.invoke(zoo, ["export", str(old.parent), "--to", "hf", "--out",
                            str(tmp_path / "old-hf")])
    assert r.exit_code == 0 and (tmp_path / "old-hf" / "tokenizer.json").is_file(), r.output


@pytest.mark.parametrize("damage", ["replaced", "removed"])
def test_a_new_run_refuses_a_build_whose_copy_is_damaged(tmp_path, trained, damage):
    """It trained, exit 0, on a build pack stats calls damaged; its export then refused."""
    build_dir = Path(shutil.copytree(trained.build, tmp_path / "build"))
    if damage == "replaced":
        shutil.copyfile(trained.other / "tokenizer.json", build_dir / "tokenizer.json")
    else:
        (build_dir / "tokenizer.json").unlink()
    run = tmp_path / "run"
    line = error_line(CliRunner().invoke(train_cli, ["--shards", str(build_dir), "--out",
                                                     str(run), "--model", "neox-tiny",
                                                     "--max-steps", "1", "--workers", "0"]))
    assert line.startswith(f"Error: {build_dir / 'tokenizer.json'}: ")
    assert ("is not the tokenizer the build's ids were made with" if damage == "replaced"
            else "missing") in line and "re-run the same pack build with --overwrite" in line
    assert not run.exists()


CRAFTED = {"sha256 a number": ("sha256", 7), "file a number": ("file", 5),
           "file outside": ("file", "../tokenizer.json"), "vocab_size gone": ("vocab_size", None),
           "vocab_size true": ("vocab_size", True)}


@pytest.mark.parametrize("craft", list(CRAFTED))
def test_a_manifest_whose_tokenizer_fields_are_crafted_is_one_line_everywhere(
        tmp_path, trained, craft):
    """A hand-edited manifest's tokenizer fields (another type, a file name outside the build,
    a field gone) were TypeErrors in pack stats, zoo export/generate/eval and train --resume."""
    key, value = CRAFTED[craft]
    build_dir = Path(shutil.copytree(trained.build, tmp_path / "build"))
    manifest = json.loads((build_dir / "manifest.json").read_text())
    if value is None:
        del manifest["tokenizer"][key]
    else:
        manifest["tokenizer"][key] = value
    (build_dir / "manifest.json").write_text(json.dumps(manifest))
    runner = CliRunner()
    for argv in (["--verify"], ["--json"], []):
        line = error_line(runner.invoke(pack, ["stats", str(build_dir), *argv]))
        assert "not a longpack manifest" in line and f"tokenizer.{key}" in line, line
    for command in (["export", str(trained.run), "--to", "hf", "--out", str(tmp_path / "hf")],
                    ["generate", str(trained.run), "--prompt", "ab"],
                    ["eval", str(trained.run)]):
        line = error_line(runner.invoke(zoo, [*command, "--shards", str(build_dir)]))
        assert "not a longpack manifest" in line and f"tokenizer.{key}" in line, line
    run = Path(shutil.copytree(trained.run, tmp_path / "run"))
    line = error_line(runner.invoke(train_cli, ["--shards", str(build_dir), "--out", str(run),
                                                "--model", "neox-tiny", "--batch-size", "4",
                                                "--max-steps", "4", "--workers", "0"]))
    assert "not a longpack manifest" in line and f"tokenizer.{key}" in line, line
    assert not (tmp_path / "hf").exists()


def test_zoo_export_help_shows_sane_flags():
    text = CliRunner().invoke(zoo, ["export", "--help"]).output
    assert "--no-tokenizer" in text and "--no-no-" not in text
    assert "--shards BUILD" in text
