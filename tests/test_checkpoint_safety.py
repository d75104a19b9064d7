"""Loading a checkpoint never runs code from it: a state.pt or a sharded checkpoint's DCP
.metadata whose pickle would create a file is refused in one line, and the file never appears.
A single process with --fsdp writes a sharded checkpoint (a process group of one)."""

import pickle

import pytest
from click.testing import CliRunner
from test_train import config

from longpack.core import sha256_file
from longpack.training.cli import train as train_cli
from longpack.training.loop import train
from longpack.zoo.cli import zoo


class Planted:
    """Unpickled, it would create the file at `path` (what a malicious checkpoint does)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def seal(step_dir):
    """COMPLETE remade over the folder's files as a checkpoint writes it (its record line
    kept): the attacker can always do this much."""
    complete = step_dir / "COMPLETE"
    lines = complete.read_text().splitlines()
    record = [line for line in lines if line.startswith("longpack checkpoint")]
    if "  " not in lines[0]:  # a whole checkpoint: state.pt's hash alone
        complete.write_text("\n".join([sha256_file(step_dir / "state.pt"), *record]) + "\n")
    else:
        names = sorted(p.name for p in step_dir.iterdir() if p.name != "COMPLETE")
        complete.write_text("".join(f"{sha256_file(step_dir / n)}  {n}\n" for n in names)
                            + "".join(f"{line}\n" for line in record))


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
    from longpack.training.checkpoints import checkpoint

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
    from longpack.training.checkpoints import checkpoint

    run = tmp_path / "run"
    train(config(shards, run, max_steps=2, save_every=2, workers=0), log=lambda m: None)
    state = run / "step-00000002" / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    said = []
    assert checkpoint.load_latest(run, said.append) is None
    assert len(said) == 1 and said[0].startswith(f"skipping checkpoint {run / 'step-00000002'}: ")
    assert said[0].endswith("; it was the only one: none is left to use"), said


# -- issue 41: a DCP bytes item, damaged parts past COMPLETE, pruning, the optimizer switch -----

def sharded_run(tmp_path, shards, steps=2):
    """A one-process --fsdp run whose checkpoints (steps 1..steps) are sharded (DCP)."""
    run = tmp_path / "run"
    train(config(shards, run, max_steps=steps, save_every=1, keep_last=steps, warmup=0,
                 workers=0, fsdp=True), log=lambda m: None)
    return run


def plant_bytes_items(step, marker, prefixes=("model.", "optimizers.state."), as_bytes=True):
    """What an attacker with write access does, with DCP's own classes only: one entry of each
    prefix re-pointed as a bytes item whose pickle creates `marker` when torch.load runs it
    with weights_only=False (DCP's default planner), in a new .distcp; COMPLETE remade.
    `as_bytes=False`: the entries stay tensors, their data re-pointed to the pickle."""
    import io

    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    metadata = pickle.loads((step / ".metadata").read_bytes())  # the attacker trusts it
    payload = io.BytesIO()
    torch.save(Planted(marker), payload)
    (step / "__9_0.distcp").write_bytes(payload.getvalue())
    planted = _StorageInfo("__9_0.distcp", 0, len(payload.getvalue()))
    for prefix in prefixes:
        fqn = next(k for k in sorted(metadata.state_dict_metadata) if k.startswith(prefix))
        if as_bytes:
            metadata.state_dict_metadata[fqn] = BytesStorageMetadata()
            metadata.storage_data[MetadataIndex(fqn)] = planted
        else:
            for index in [i for i in metadata.storage_data if i.fqn == fqn]:
                metadata.storage_data[index] = planted
    (step / ".metadata").write_bytes(pickle.dumps(metadata))
    seal(step)


@pytest.mark.slow
def test_a_sharded_checkpoint_holds_no_pickled_item_and_a_planted_one_is_never_run(tmp_path,
                                                                                   shards):
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from longpack.training.checkpoints import checkpoint

    run = sharded_run(tmp_path, shards)
    step = run / "step-00000002"
    kinds = {type(m) for m in pickle.loads((step / ".metadata").read_bytes())
             .state_dict_metadata.values()}
    assert kinds == {TensorStorageMetadata}  # lr, betas, ... are in state.pt, read weights-only
    with torch.serialization.safe_globals(checkpoint.NUMPY_GLOBALS):  # the RNG state's arrays
        saved = torch.load(step / "state.pt", weights_only=True)
    assert saved["param_groups"][0]["lr"] > 0
    marker = tmp_path / "planted"
    pristine = {p.name: p.read_bytes() for p in step.iterdir()}
    plant_bytes_items(step, marker)
    base = ["--shards", str(shards), "--out", str(run), "--max-steps", "4", "--warmup", "0",
            "--batch-size", "4", "--workers", "0"]
    for extra in (["--fsdp"], []):  # sharded, and a plain process reading it whole
        result = CliRunner().invoke(train_cli, base + extra)
        assert result.exit_code == 1 and not marker.exists(), result.output
        line = result.output.strip().splitlines()[-1]
        assert "Traceback" not in result.output and line.startswith("Error: ")
        assert "holds more than data" in line and "nothing in it was run" in line, line
    for command in (["export", str(run), "--to", "safetensors", "--out", str(tmp_path / "o")],
                    ["generate", str(run), "--prompt", "abc", "--max-new-tokens", "2"],
                    ["eval", str(run), "--shards", str(shards)]):
        result = CliRunner().invoke(zoo, command)
        assert result.exit_code != 0 and not marker.exists(), (command, result.output)
        assert "Traceback" not in result.output, result.output
        assert result.output.strip().splitlines()[-1].startswith("Error: "), result.output
    # a tensor item whose data is re-pointed to the pickle: DCP reads tensors weights-only
    for name, data in pristine.items():
        (step / name).write_bytes(data)
    plant_bytes_items(step, marker, prefixes=("model.",), as_bytes=False)
    result = CliRunner().invoke(train_cli, base + ["--fsdp"])
    assert result.exit_code == 1 and not marker.exists(), result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: ") and "cannot be read" in line and "GLOBAL" in line, line
    assert "weights_only" not in line  # torch's advice to load it unsafely is not passed on
    result = CliRunner().invoke(zoo, ["export", str(run), "--to", "safetensors", "--out",
                                      str(tmp_path / "o2")])
    assert result.exit_code == 1 and not marker.exists(), result.output
    assert "GLOBAL" in result.output.strip().splitlines()[-1], result.output


@pytest.mark.slow
def test_a_sharded_checkpoint_damaged_past_its_complete_falls_back_to_the_one_before(tmp_path,
                                                                                      shards):
    """Truncated, deleted, or metadata that is not DCP's, with COMPLETE remade to match: named
    in one line, and the checkpoint before it is used."""
    import shutil

    from longpack.training.checkpoints import checkpoint

    made = sharded_run(tmp_path, shards)
    pristine = {p.name: p.read_bytes() for p in (made / "step-00000002").iterdir()}
    part = next(n for n in pristine if n.endswith(".distcp"))
    damages = {"truncated": lambda: (step / part).write_bytes(pristine[part][:100]),
               "deleted": lambda: (step / part).unlink(),
               "metadata": lambda: (step / ".metadata").write_bytes(b"not a pickle at all")}
    expected = {"truncated": "is shorter than .metadata says", "deleted": "is missing",
                "metadata": "is not a DCP metadata file"}
    for kind, damage in damages.items():
        run = tmp_path / kind
        shutil.copytree(made, run)
        step = run / "step-00000002"
        damage()
        seal(step)
        said = []
        _, path = checkpoint.load_latest(run, said.append)
        assert path.name == "step-00000001", kind
        assert len(said) == 1 and expected[kind] in said[0] and "using the one before" in said[0]
        resumed = []
        train(config(shards, run, max_steps=3, save_every=1, keep_last=3, warmup=0, workers=0,
                     fsdp=True), log=resumed.append)
        assert any("resumed from" in m and "step-00000001" in m for m in resumed), resumed


@pytest.mark.slow
def test_a_run_prunes_and_resumes_only_its_own_checkpoints(tmp_path, shards):
    import shutil

    run = tmp_path / "run"
    train(config(shards, run, max_steps=2, save_every=1, keep_last=1, warmup=0, workers=0),
          log=lambda m: None)
    export = run / "step-hf"  # zoo export --out inside the run folder
    result = CliRunner().invoke(zoo, ["export", str(run), "--to", "safetensors", "--out",
                                      str(export)])
    assert result.exit_code == 0, result.output
    best = run / "step-00000002-best"  # a user's copy
    shutil.copytree(run / "step-00000002", best)
    renamed = run / "step-00000009"  # a copy under a checkpoint's name: its record says step 2
    shutil.copytree(run / "step-00000002", renamed)
    said = []
    train(config(shards, run, max_steps=4, save_every=1, keep_last=1, warmup=0, workers=0),
          log=said.append)
    assert any("resumed from" in m and "step-00000002 at step 2" in m for m in said), said
    assert sorted(p.name for p in run.glob("step-*")) == [
        "step-00000002-best", "step-00000004", "step-00000009", "step-hf"]
    assert (export / "model.safetensors").is_file() and (best / "COMPLETE").is_file()


@pytest.mark.slow
def test_resuming_with_another_optimizer_says_what_changed(tmp_path, shards):
    run = tmp_path / "run"
    train(config(shards, run, max_steps=2, save_every=2, warmup=0, workers=0),
          log=lambda m: None)
    result = CliRunner().invoke(train_cli, [
        "--shards", str(shards), "--out", str(run), "--max-steps", "4", "--warmup", "0",
        "--batch-size", "4", "--workers", "0", "--optimizer", "muon"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    line = result.output.strip().splitlines()[-1]
    assert "--optimizer adamw" in line and "--optimizer muon" in line, line


@pytest.mark.slow
def test_a_run_whose_every_checkpoint_is_damaged_stops_rather_than_start_afresh(tmp_path,
                                                                                shards):
    run = sharded_run(tmp_path, shards)  # steps 1 and 2
    for step in ("step-00000001", "step-00000002"):
        part = next((run / step).glob("*.distcp"))
        part.write_bytes(part.read_bytes()[:100])  # COMPLETE now disagrees
    args = ["--shards", str(shards), "--out", str(run), "--max-steps", "4", "--warmup", "0",
            "--batch-size", "4", "--workers", "0"]
    result = CliRunner().invoke(train_cli, args)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output.count("skipping checkpoint") == 2
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: ") and "none of its 2 checkpoint(s) can be read" in line, line
    assert "--resume never" in line
    assert sorted(p.name for p in run.glob("step-*")) == ["step-00000001", "step-00000002"]
    result = CliRunner().invoke(train_cli, args + ["--resume", "never"])  # afresh, as told
    assert result.exit_code == 0, result.output
