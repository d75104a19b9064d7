"""`train`'s command line: refusals as one-line errors before anything is read or made, flags."""

import pytest
from click.testing import CliRunner

from conftest import vocab_of
from longpack.training.cli import train as train_cli
from longpack.training.config import TrainConfig
from longpack.training.loop import train


def run_cli(*args):
    return CliRunner().invoke(train_cli, [str(a) for a in args])


def one_line_error(r, *parts):
    """exit 1, no traceback, and one `Error:` line holding every part."""
    assert r.exit_code == 1, r.output
    assert isinstance(r.exception, SystemExit), repr(r.exception)  # not an uncaught exception
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, r.output
    for part in parts:
        assert part in errors[0], errors[0]
    return errors[0]


def test_an_unknown_model_is_refused_listing_the_choices_before_the_data(tmp_path):
    # --shards points nowhere: the model is refused first, so nothing was opened.
    r = run_cli("--shards", tmp_path / "nowhere", "--out", tmp_path / "r", "--model", "neox-tny")
    one_line_error(r, "--model", "'neox-tny'", "neox-tiny", "moe-tiny", "gpt-neox", "resonance")


def test_resuming_with_another_model_names_both_and_the_fix(tmp_path, shards):
    run = tmp_path / "r"
    train(TrainConfig(shards=str(shards), out=str(run), model="neox-tiny", batch_size=2,
                      max_steps=2, warmup=1, workers=0), log=lambda m: None)
    # again with the build gone: the checkpoint's model is checked before the data is opened
    r = run_cli("--shards", tmp_path / "nowhere", "--out", run, "--model", "resonance-tiny")
    one_line_error(r, "step-00000002 holds a neox-tiny model", "--model resonance-tiny",
                   "pass --model neox-tiny to resume it", "--resume never")
    r = run_cli("--shards", shards, "--out", run, "--model", "resonance-tiny")  # was a traceback
    one_line_error(r, "holds a neox-tiny model", "pass --model neox-tiny")
    r = run_cli("--shards", shards, "--out", run, "--model", "resonance-tiny", "--max-steps", "1",
                "--warmup", "1", "--batch-size", "2", "--resume", "never")
    assert r.exit_code == 0, r.output  # the way out the message gives


def test_no_flag_of_train_is_taken_by_torchrun():
    # torchrun's argparse reads every --x on its line, the script's too, as a possible
    # abbreviation of its own options: `--log` matched --log-dir and --logs-specs and was refused.
    from torch.distributed.run import get_args_parser

    theirs = [o for a in get_args_parser()._actions for o in a.option_strings]
    ours = [o for p in train_cli.params if not p.hidden for o in (*p.opts, *p.secondary_opts)]
    assert "--report-to" in ours and "--log" not in ours
    assert [(o, t) for o in ours for t in theirs if t.startswith(o)] == []


def test_report_to_takes_the_comma_form_help_shows(tmp_path, shards):
    assert TrainConfig(shards="x", report_to="console,jsonl,tensorboard").report_to == (
        "console", "jsonl", "tensorboard")
    assert TrainConfig(shards="x", report_to=["jsonl"]).report_to == ("jsonl",)  # a TOML list
    assert "[default: console,jsonl]" in " ".join(run_cli("--help").output.split())
    args = ("--shards", shards, "--batch-size", 2, "--max-steps", 2, "--warmup", 1,
            "--log-every", 1, "--workers", 0)
    r = run_cli(*args, "--out", tmp_path / "a", "--report-to", "jsonl, console")
    assert r.exit_code == 0, r.output
    assert r.output.count(" loss ") == 2 + 1 and (tmp_path / "a" / "metrics.jsonl").is_file()
    r = run_cli(*args, "--out", tmp_path / "b", "--report-to", "jsonl")
    assert r.exit_code == 0 and " lr " not in r.output  # no console lines
    r = run_cli(*args, "--out", tmp_path / "c", "--report-to", "console,jsnol")
    one_line_error(r, "--report-to 'jsnol': choose from console, jsonl, tensorboard, wandb")
    r = run_cli(*args, "--out", tmp_path / "d", "--log", "jsonl")
    assert r.exit_code == 2 and "--log is now --report-to" in r.output


def test_shards_is_marked_required_and_may_come_from_the_config_file(tmp_path, shards):
    help_text = " ".join(run_cli("--help").output.split())
    shards_help = help_text[help_text.index("--shards"):help_text.index("--seq")]
    assert "[required]" in shards_help
    r = run_cli("--out", tmp_path / "r")
    assert r.exit_code == 2 and "Missing option '--shards'" in r.output
    (tmp_path / "run.yaml").write_text(f"shards: {shards}\nbatch_size: 2\nreport_to: [jsonl]\n")
    r = run_cli("--config", tmp_path / "run.yaml", "--out", tmp_path / "r", "--dry-run")
    assert r.exit_code == 0, r.output
    assert f"shards=('{shards}',)" in r.output and "report_to=('jsonl',)" in r.output
    assert run_cli("--list-models").exit_code == 0  # needs no --shards


def tree(path):
    return sorted(p.relative_to(path) for p in path.rglob("*"))


def test_a_refused_run_leaves_nothing_under_out(tmp_path, shards, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed, wherever it is
    out = tmp_path / "r"
    refused = [
        ("--shards", tmp_path / "nowhere"),  # no build there
        ("--shards", shards, "--seq", 24),  # not a divisor of the build's rows
        ("--shards", shards, "--model", "neox-tny"),
        ("--shards", shards, "--report-to", "console,wandb"),  # not installed
        # known once the data is open: a stage past the run's end
        ("--shards", shards, "--mix-stage", f"20:{shards.name}=1", "--max-steps", 10),
        ("--shards", shards, "--batch-size", "many"),  # a bad flag (click: exit 2)
    ]
    for args in refused:
        r = run_cli(*args, "--out", out)
        assert r.exit_code in (1, 2), (args, r.output)
        assert not out.exists(), (args, tree(out))


def test_a_refused_resume_leaves_the_run_as_it_was(tmp_path, shards):
    import json

    out = tmp_path / "r"
    train(TrainConfig(shards=str(shards), out=str(out), batch_size=2, max_steps=2, warmup=1,
                      workers=0), log=lambda m: None)
    before = tree(out)
    assert any(p.parts[0] == "shard-cache" for p in before)  # the MDS build was cached there
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["fingerprint"]["settings"]["seed"] = 99  # as if built with another seed
    (shards / "manifest.json").write_text(json.dumps(manifest))
    one_line_error(run_cli("--shards", shards, "--out", out, "--batch-size", 2),
                   "trained on other shards")
    assert tree(out) == before  # no shard-cache/FINGERPRINT of the refused shards


def test_dry_run_says_the_plan_at_once_then_each_probe_step(tmp_path, shards):
    from longpack.training.dry_run import PROBE_STEPS, plan

    said = []
    plan(TrainConfig(shards=str(shards), batch_size=4, max_steps=10), say=said.append)
    text = "\n".join(said)
    # the static plan is one line said before the probe starts, then a line per probe step
    assert "parameters" in said[0] and "tokens/step" in said[0] and "GiB" in said[0]
    assert "probe" not in said[0] and "probe" in said[1]
    steps = [line for line in said if "probe       step" in line]
    assert len(steps) == PROBE_STEPS + 1 and "warm-up" in steps[0]
    assert all(" s, loss " in line for line in steps)
    assert "4 x 64 tokens on cpu" in said[1] and "measured here" in text  # small: probed whole


@pytest.mark.slow
def test_the_dry_run_probes_the_step_training_takes(shards):
    """The probe runs the trainer's step (clipping, grad scaler, optimizers), not a forward and
    backward of its own: with the gradient clipped to almost nothing the probe's loss stands
    still; unclipped, three steps on the same batch bring it down."""
    from longpack.training.dry_run import plan

    def probe_losses(clip):
        cfg = TrainConfig(shards=str(shards), batch_size=4, max_steps=10, lr=3e-3, warmup=0,
                          clip=clip, weight_decay=0.0)
        return plan(cfg, say=lambda _: None)["probe_losses"]

    free, clipped = probe_losses(0), probe_losses(1e-12)
    assert free[0] == clipped[0]  # the same weights (the run's seed) and batch
    assert free[-1] < free[0] - 0.05
    assert abs(clipped[-1] - clipped[0]) < 1e-3


def test_a_cpu_probe_is_cut_to_a_few_seconds_and_scaled(tmp_path):
    import torch

    from longpack import archs
    from longpack.training.step_time import CPU_PROBE_FLOPS, probe_shape

    fpt = archs.build("neox-tiny", device="meta", vocab_size=50257).flops_per_token
    # the run: seq 32768, batch 8 -- 23 TFLOPs a step; the CPU probe does ~3e10
    rows, length = probe_shape(fpt, 32767, 8, torch.device("cpu"))
    assert rows == 1 and 16 <= length < 32767
    assert fpt(length) * length <= CPU_PROBE_FLOPS < fpt(32767) * 32767 * 8
    assert probe_shape(fpt, 32767, 8, torch.device("cuda")) == (8, 32767)  # the real one
    assert probe_shape(fpt, 64, 4, torch.device("cpu")) == (4, 64)  # small enough: whole


@pytest.mark.slow
def test_dry_run_of_a_large_model_on_cpu_says_what_it_probed(tmp_path, shards):
    r = run_cli("--shards", shards, "--model", "neox-125m", "--batch-size", 8, "--dry-run")
    assert r.exit_code == 0, r.output
    assert "the run's micro-batch is 8 x 64: the time is scaled up by FLOPs" in r.output
    assert "and scaled by FLOPs) -> ETA" in r.output


@pytest.mark.parametrize("model, args, says", [
    ("resonance-tiny", [], "the head is a weight of its own (16,448): --model-arg "
                           "tie_embeddings=true makes it the embedding's, "),
    ("resonance-tiny", ["--model-arg", "tie_embeddings=true"], "+ the head, tied to it + "),
    ("mamba-tiny", [], "+ the head, tied to it + ")])
def test_the_dry_run_says_where_the_head_is_and_how_to_tie_it(shards, model, args, says):
    """A seed's "LM head with tied weights" counted 50M more here, with no word of why; a tied
    head was counted twice (the rest came out negative)."""
    import json

    r = run_cli("--shards", shards, "--model", model, *args, "--dry-run", "--json",
                "--world-size", 1)
    assert r.exit_code == 0, r.output
    assert says in r.output
    plan = json.loads(r.stdout)
    parts = plan["param_parts"]
    assert parts["rest"] >= 0 and parts["tied"] == ("tied" in says)
    assert parts["embedding"] + parts["head"] + sum(parts["layers"]) + parts["rest"] == \
        plan["params"]


def test_console_and_records_say_progress_and_eta(tmp_path, shards):
    import json

    said = []
    train(TrainConfig(shards=str(shards), out=str(tmp_path / "r"), batch_size=2, max_steps=4,
                      warmup=1, log_every=1, workers=0), log=said.append)
    lines = [line for line in said if line.startswith("step")]
    # before step 0 (which may take minutes: compiling, a GPU warming up), what is starting
    first = said.index(lines[0]) - 1
    assert said[first].startswith("training neox-tiny (") and said[first].endswith(
        " parameters) for steps 0 to 3 of 2 x 64 tokens on 1 cpu process"), said
    # the step as metrics.jsonl numbers it, then the steps done of the run's and their share
    assert [line.split(" loss")[0] for line in lines] == [
        "step 0 (1/4, 25.0%)", "step 1 (2/4, 50.0%)", "step 2 (3/4, 75.0%)", "step 3 (4/4, 100.0%)"]
    assert lines[0].endswith("ETA -") and lines[-1].endswith("ETA 0s")  # pace known from step 2
    assert all(" ETA " in line and "s" in line.split(" ETA ")[1] for line in lines[1:])
    records = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [int(line.split()[1]) for line in lines] == [x["step"] for x in records]
    assert [x["progress"] for x in records] == [0.25, 0.5, 0.75, 1.0]
    assert records[0]["eta_seconds"] is None and records[-1]["eta_seconds"] == 0.0
    assert records[1]["eta_seconds"] > records[2]["eta_seconds"] > 0  # 2 steps left, then 1


def test_eta_is_the_pace_after_the_first_step_times_the_steps_left(monkeypatch):
    import types

    from longpack.training import loop
    from longpack.training.loop import Eta

    now = [100.0]  # a clock the test moves: no sleep, no dependence on the machine's load
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    eta = Eta(total=10)
    assert eta.after(3) == {"progress": 0.4, "eta_seconds": None}  # resumed at step 3
    now[0] += 0.2
    after = eta.after(5)  # 2 steps in 0.2 s, 4 left
    assert after["progress"] == 0.6 and 0.35 < after["eta_seconds"] < 0.8
    assert after["eta_seconds"] == pytest.approx(0.4)


@pytest.mark.slow
def test_list_models_sizes_presets_at_the_build_vocabulary(shards):
    from longpack import archs

    def row(output, name):
        return next(line.split() for line in output.splitlines() if line.startswith(name + " "))

    at_build = run_cli("--list-models", "--shards", shards)
    assert at_build.exit_code == 0, at_build.output
    vocab = vocab_of(shards)
    tiny = archs.build("neox-tiny", device="meta", vocab_size=vocab)  # the build's vocab
    assert row(at_build.output, "neox-tiny")[2:4] == [f"{vocab:,}", f"{tiny.num_params():,}"]
    assert f"at the vocabulary of {shards}: {vocab:,}" in at_build.output
    own = run_cli("--list-models")
    assert row(own.output, "neox-tiny")[2] == f"{archs.config('neox-tiny').vocab_size:,}"
    assert "each preset at its own vocabulary" in own.output
    r = run_cli("--list-models", "--shards", shards.parent / "nowhere")
    one_line_error(r, "manifest.json not found")


def test_the_memory_estimate_counts_the_logits_the_loss_keeps():
    from longpack.archs.activations import CE_CHUNK, loss_bytes
    from longpack.archs.layers import LOGITS_BUDGET_BYTES

    assert loss_bytes(4 * 64, 50257) == 8 * 4 * 64 * 50257  # all kept, with their gradient
    assert 8 * 32767 * 50257 * 4 > LOGITS_BUDGET_BYTES  # seq 32k: chunked and recomputed
    assert loss_bytes(8 * 32767, 50257) == 8 * CE_CHUNK * 50257


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-inf", "0"])
def test_gpu_memory_must_be_a_positive_finite_number(value):
    r = run_cli("--shards", "x", "--dry-run", "--gpu-memory", value)
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output  # a usage error
    assert "--gpu-memory must be a positive, finite number of GiB" in r.output
    assert "Traceback" not in r.output


def test_a_weight_decay_that_would_flip_every_weight_is_refused():
    from longpack.core.errors import SettingsError

    for wd, lr in ((1e300, 3e-4), (2.0, 0.5)):
        with pytest.raises(SettingsError, match="lr x weight decay must be below 1"):
            TrainConfig(shards=("x",), out="o", weight_decay=wd, lr=lr, min_lr=0)
    TrainConfig(shards=("x",), out="o", weight_decay=1.0, lr=0.5, min_lr=0)  # halves: allowed


def test_a_run_records_its_builds_where_they_are_not_as_typed(tmp_path, monkeypatch):
    """Checkpoints and W&B keep TrainConfig.to_dict(): a relative --shards there would name
    another folder for `zoo export` run from elsewhere (issue 44)."""
    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig(shards=("./fwe", "web=../dolma", "s3://bucket/x"), cache="cache",
                      out=str(tmp_path / "run"))
    recorded = cfg.to_dict()
    assert recorded["shards"] == (str(tmp_path / "fwe"), f"web={tmp_path.parent / 'dolma'}",
                                  "s3://bucket/x")
    assert recorded["cache"] == str(tmp_path / "cache")
    assert cfg.shards == ("./fwe", "web=../dolma", "s3://bucket/x")  # the run itself: as given


def test_help_comes_in_sections_holding_every_flag_once():
    import dataclasses
    import re

    from longpack.training.cli import HELP_SECTIONS

    text = run_cli("--help").output
    headings = [line[:-1] for line in text.splitlines() if re.fullmatch(r"[A-Z][\w ]*:", line)]
    assert headings == ["Run", *HELP_SECTIONS.values()] and "Options:" not in text
    flags = re.findall(r"^  (--[a-z0-9-]+)", text, re.M)
    assert len(flags) == len(set(flags))
    for f in dataclasses.fields(TrainConfig):
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        assert flag in flags, flag
    assert text.index("\n  --shards") > text.index("Data:") > text.index("\n  --resume")
    assert text.index("Reports:") < text.index("\n  --wandb-project")
