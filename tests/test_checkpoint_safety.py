"""Loading a checkpoint never runs code from it: a state.pt or a sharded checkpoint's DCP
.metadata whose pickle would create a file is refused in one line, and the file never appears.
A single process with --fsdp writes a sharded checkpoint (a process group of one)."""

import pickle

import pytest
from click.testing import CliRunner
from test_train import config

from longpack import sha256_file
from training.cli import train as train_cli
from training.loop import train
from training.zoo_cli import zoo


class Planted:
    """Unpickled, it would create the file at `path` (what a malicious checkpoint does)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def seal(step_dir):
    """COMPLETE as a checkpoint writes it: the attacker can always do this much."""
    complete = step_dir / "COMPLETE"
    lines = complete.read_text().splitlines()
    if len(lines) == 1 and "  " not in lines[0]:
        complete.write_text(sha256_file(step_dir / "state.pt") + "\n")
    else:
        complete.write_text("".join(f"{sha256_file(step_dir / line.split('  ', 1)[1])}  "
                                    f"{line.split('  ', 1)[1]}\n" for line in lines))


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.slow
def test_a_checkpoint_whose_pickle_would_run_code_is_refused_unrun(tmp_path, shards, sharded):
    run = tmp_path / "run"
    train(config(shards, run, max_steps=2, save_every=2, warmup=0, workers=0, fsdp=sharded),
          log=lambda m: None)
    step = run / "step-00000002"
    planted = tmp_path / "planted"
    victim = step / (".metadata" if sharded else "state.pt")
    victim.write_bytes(pickle.dumps({"weights": Planted(planted)}))
    seal(step)
    args = ["--shards", str(shards), "--out", str(run), "--max-steps", "4", "--warmup", "0",
            "--batch-size", "4", "--workers", "0", "--resume", str(step)]
    result = CliRunner().invoke(train_cli, args + (["--fsdp"] if sharded else []))
    assert result.exit_code == 1, result.output
    assert not planted.exists()
    line = result.output.strip().splitlines()[-1]
    assert "Traceback" not in result.output and line.startswith("Error: ")
    assert ("is not a DCP metadata file" if sharded else "holds more than a checkpoint's data") \
        in line and "nothing in it was run" in line, line
    # zoo refuses it too (a whole checkpoint's state.pt: skipped, as damaged, for none left)
    result = CliRunner().invoke(zoo, ["export", str(run), "--to", "safetensors", "--out",
                                      str(tmp_path / "o")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert not planted.exists()
    assert result.output.strip().splitlines()[-1].startswith("Error: ")


@pytest.mark.slow
def test_a_sharded_checkpoint_through_a_bucket_and_damaged_parts(tmp_path, shards, s3,
                                                                  monkeypatch):
    """A --fsdp run (one process) uploads every file of its sharded checkpoints, COMPLETE last;
    a fresh machine resumes from the bucket bitwise; a flipped byte in a part is caught by
    COMPLETE and the checkpoint before it is used."""
    from training import checkpoint

    straight = train(config(shards, tmp_path / "straight", max_steps=6, save_every=2,
                            warmup=0, workers=0, fsdp=True), log=lambda m: None)
    cfg = config(shards, s3.url("run"), max_steps=6, save_every=2, warmup=0, workers=0,
                 fsdp=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-a"))
    train(cfg, stop_at=4, log=lambda m: None)
    names = {key.split("/", 2)[2] for key in s3.keys("run/step-00000004/")}
    assert names == {".metadata", "__0_0.distcp", "state.pt", "COMPLETE"}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "machine-b"))
    said = []
    resumed = train(cfg, log=said.append)
    assert any("resumed from" in m and "at step 4" in m for m in said)
    assert [h["loss"] for h in resumed] == [h["loss"] for h in straight]
    # a part damaged on disk: COMPLETE tells, the one before is taken, said in one line
    run = tmp_path / "straight"
    part = run / "step-00000006" / "__0_0.distcp"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 1
    part.write_bytes(bytes(data))
    said = []
    state, path = checkpoint.load_latest(run, said.append)
    assert path.name == "step-00000004" and said == [
        f"skipping checkpoint {run / 'step-00000006'}: __0_0.distcp does not match its "
        "checksum; using the one before it"]
    assert isinstance(state["step"], int) and "model" not in state


def test_a_damaged_only_checkpoint_is_not_said_to_fall_back_to_one_before_it(tmp_path, shards):
    from training import checkpoint

    run = tmp_path / "run"
    train(config(shards, run, max_steps=2, save_every=2, workers=0), log=lambda m: None)
    state = run / "step-00000002" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    said = []
    assert checkpoint.load_latest(run, said.append) is None
    assert len(said) == 1 and said[0].startswith(f"skipping checkpoint {run / 'step-00000002'}: ")
    assert said[0].endswith("; it was the only one: none is left to use"), said
