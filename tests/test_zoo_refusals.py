"""zoo eval and zoo generate on what a careless or unlucky user gives them: a build of another
tokenizer, an empty prompt, a boundless --max-new-tokens, Ctrl+C, a corrupt newest checkpoint.
Each is a one-line refusal, an exact result or a clean stop."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_train import config

from conftest import signals_as_from_a_shell
from longpack.pipeline.cli import pack
from longpack.training.checkpoints import checkpoint
from longpack.training.loop import train
from longpack.zoo.cli import zoo

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def neox_run(tmp_path_factory, shards_once):
    """A 2-step run on `shards`, trained once for the module: a test that changes it copies it."""
    run = tmp_path_factory.mktemp("zoo") / "run"
    train(config(shards_once, run, max_steps=2, save_every=2, workers=0), log=lambda m: None)
    return run


def last_line(result) -> str:
    assert "Traceback" not in result.output, result.output
    return result.output.strip().splitlines()[-1]


def test_zoo_eval_refuses_a_build_of_another_tokenizer(tmp_path, shards, neox_run):
    import shutil

    neox_run = Path(shutil.copytree(neox_run, tmp_path / "run"))  # its checkpoint is changed
    src = tmp_path / "rows.npy"
    np.save(src, np.random.default_rng(0).integers(0, 256, (8, 65)).astype(np.int64))
    other = tmp_path / "imported"
    assert CliRunner().invoke(pack, ["import", str(src), "--out", str(other),
                                     "--eos-id", "10"]).exit_code == 0
    sha = json.loads((shards / "manifest.json").read_text())["tokenizer"]["sha256"][:12]
    result = CliRunner().invoke(zoo, ["eval", str(neox_run), "--shards", str(other),
                                      "--split", "train"])
    assert result.exit_code == 1
    assert last_line(result) == (
        f"Error: {other} is a build of imported ids (no tokenizer, vocabulary 256), the run "
        f"trained with bytes-tokenizer (sha256 {sha}, vocabulary 257): evaluate on a build of the "
        "run's tokenizer")
    # a checkpoint from before the tokenizer was recorded: the run's build's manifest tells
    latest = neox_run / "step-00000002"
    state = torch.load(latest / "state.pt", weights_only=False)
    assert state.pop("tokenizer")["sha256"].startswith(sha)
    torch.save(state, latest / "state.pt")
    (latest / "COMPLETE").write_text(checkpoint.sha256_file(latest / "state.pt") + "\n")
    result = CliRunner().invoke(zoo, ["eval", str(neox_run), "--shards", str(other),
                                      "--split", "train"])
    assert result.exit_code == 1
    assert f"the run trained with bytes-tokenizer (sha256 {sha}" in last_line(result)
    # the run's own build still evaluates
    assert CliRunner().invoke(zoo, ["eval", str(neox_run), "--shards", str(shards)]).exit_code == 0


def test_an_empty_prompt_starts_a_new_document(neox_run):
    from longpack.archs.generate import generate
    from longpack.zoo.runs import load_run

    result = CliRunner().invoke(zoo, ["generate", str(neox_run), "--prompt", "",
                                      "--max-new-tokens", "8"])
    assert result.exit_code == 0, result.output
    trained = load_run(neox_run)
    tok = trained.tokenizer
    new = generate(trained.model, [tok.eos_id], 8, eos_id=tok.eos_id,
                   allowed=torch.from_numpy(tok.decodable()))
    assert result.output == tok.decode(new) + "\n"


def test_max_new_tokens_is_bounded_by_the_models_context(neox_run):
    from longpack.zoo.runs import load_run

    trained = load_run(neox_run)
    limit = max(trained.model.cfg.max_seq, trained.seq)  # neox-tiny: max_seq 256, rows of 65
    assert limit == 256
    result = CliRunner().invoke(zoo, ["generate", str(neox_run), "--prompt", "ab",
                                      "--max-new-tokens", str(10**12)])
    assert result.exit_code == 0, result.output
    assert ("note: at most 254 new tokens: the model's context is 256 tokens and the prompt "
            "takes 2") in result.output
    result = CliRunner().invoke(zoo, ["generate", str(neox_run), "--prompt", "x" * 300])
    assert result.exit_code == 1
    assert last_line(result) == ("Error: --prompt is 300 tokens, the model's context is 256 "
                                 "(its max_seq or the rows it trained on): shorten it")


def test_text_is_streamed_whole_characters_at_a_time(byte_tokenizer):
    from longpack.archs.generate import TextStream
    from longpack.pipeline import load_tokenizer

    tok = load_tokenizer(byte_tokenizer)  # one token a byte: characters split over tokens
    ids = tok.reference.encode_flat(["δέλτα € long-context 🚀 end"])[0].tolist()
    text = TextStream(tok.decode)
    pieces = [text.add(i) for i in ids] + [text.flush()]
    assert "".join(pieces) == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)
    assert sum(1 for p in pieces if p) > 10  # it came out as it went, not at the end
    cut = TextStream(tok.decode)  # a character left unfinished at the end is what decode gives
    pieces = [cut.add(i) for i in ids[:ids.index(0xF0) + 2]] + [cut.flush()]
    assert "".join(pieces) == tok.decode(ids[:ids.index(0xF0) + 2])


def test_a_corrupt_newest_checkpoint_is_one_warning_line(tmp_path, shards):
    run = tmp_path / "run"
    train(config(shards, run, max_steps=4, save_every=2, workers=0), log=lambda m: None)
    (run / "step-00000004" / "state.pt").write_bytes(b"truncated")
    for args in (["generate", str(run), "--prompt", "a", "--max-new-tokens", "2"],
                 ["export", str(run), "--to", "safetensors", "--out", str(tmp_path / "o")]):
        result = CliRunner().invoke(zoo, args)
        assert result.exit_code == 0, result.output
        warned = [line for line in result.output.splitlines() if "skipping" in line]
        assert warned == [f"warning: skipping checkpoint {run / 'step-00000004'}: state.pt does "
                          "not match its checksum; using the one before it"]
        assert "UserWarning" not in result.output


@pytest.mark.slow
def test_ctrl_c_stops_an_unbounded_generation_cleanly(tmp_path, shards):
    """Mamba has no context bound (a constant-size state): it runs until Ctrl+C, printing as it
    goes, and stops with what it printed and one line."""
    run = tmp_path / "mamba"
    train(config(shards, run, model="mamba-tiny", max_steps=1, warmup=0, save_every=1, workers=0),
          log=lambda m: None)
    # EOS's logit 0 where the greedy pick's is above 0: the text never ends by itself
    latest = run / "step-00000001"
    state = torch.load(latest / "state.pt", weights_only=False)
    weights = checkpoint.model_state((state, latest))
    weights["head.weight"][state["tokenizer"]["eos_id"]] = 0
    # written back as a checkpoint of format 2 (the weights in state.pt), which zoo reads too
    for part in [latest / ".metadata", *latest.glob("*.distcp")]:
        part.unlink()
    torch.save({**state, "format": 2, "model": weights}, latest / "state.pt")
    (latest / "COMPLETE").write_text(checkpoint.sha256_file(latest / "state.pt") + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "longpack.zoo.cli", "generate", str(run), "--prompt", "alpha",
         "--max-new-tokens", str(10**12)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=signals_as_from_a_shell)
    try:
        assert len(proc.stdout.read(len("alpha") + 20)) == 25  # streamed: text before any end
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err.decode() and out
    assert err.decode().strip().splitlines()[-1].startswith("zoo generate: stopped by Ctrl+C "
                                                            "after ")


def test_zoo_list_refuses_a_vocabulary_no_model_takes():
    result = CliRunner().invoke(zoo, ["list", "--vocab", str(10**17)])
    assert result.exit_code == 1
    assert last_line(result) == (f"Error: --vocab {10**17}: vocab_size must be in 1..2147483647 "
                                 f"(got {10**17})")


@pytest.mark.parametrize("flags, says", [
    (["--temperature", "nan"], "Error: --temperature must be at least 0 and finite (got nan)"),
    (["--top-p", "nan"], "Error: --top-p must be in (0, 1] (got nan)"),  # acted as 1.0
    (["--temperature", "1", "--seed", str(10**20)], "Error: --seed must be in "
     "[0, 9223372036854775808) (got 100000000000000000000): torch.Generator takes 64 bits"),
])
def test_sampling_settings_no_number_can_mean_are_one_line(neox_run, flags, says):
    r = CliRunner().invoke(zoo, ["generate", str(neox_run), "--prompt", "hi", *flags])
    assert r.exit_code == 1 and last_line(r) == says


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["export", "--to", "hf"]])
def test_a_step_without_a_checkpoint_names_the_steps_there_not_resume(tmp_path, neox_run,
                                                                       command):
    """It used to say "--resume RUN/step-00000003 ...; pass ... auto or never", a train flag."""
    extra = ["--out", str(tmp_path / "x")] if command[0] == "export" else []
    r = CliRunner().invoke(zoo, [command[0], str(neox_run), *command[1:], *extra, "--step", "3"])
    assert r.exit_code == 1
    assert last_line(r) == (f"Error: --step 3: {neox_run}/step-00000003: not a complete "
                            "checkpoint (no COMPLETE file); its complete checkpoints are of "
                            "steps 2; pass one of them, or no --step for the newest")
