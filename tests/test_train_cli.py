"""`train`'s command line: refusals as one-line errors before anything is read or made, flags."""

from click.testing import CliRunner

from training.cli import train as train_cli
from training.config import TrainConfig
from training.loop import train


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
