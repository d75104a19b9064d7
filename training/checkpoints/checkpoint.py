"""Checkpoints: RUN/step-NNNNNNNN/ directories, written whole or not at all, newest kept; what
they hold (`capture`) and how a run takes it back (`check_model`, `check_data`, `restore`).

A checkpoint is written into `.step-N.tmp/`, with a `COMPLETE` file written last, then renamed;
`RUN/latest` names the newest. Loading takes the newest checkpoint whose files match COMPLETE,
saying (in one line) which it skips. A run reads and prunes only its own checkpoints: folders
named exactly `step-NNNNNNNN` whose COMPLETE ends in the record `longpack checkpoint of step N`
of that same N (or, written before the record, a COMPLETE of file hashes alone). Anything else
in RUN (an export, a user's copy `step-00000002-best`) is never resumed from nor removed.

state.pt holds the grad scaler, RNG states, the step, the shards' fingerprint and seq, the
config, the optimizers' param_groups and the batch hashes of the last RECENT_HASHES steps: a
resumed run recomputes those from its own order and refuses to go on if they differ. The model
and the optimizers' tensors are DCP files beside it, each process's part (dcp_files.py),
whatever the number of processes and sharding; COMPLETE lists the sha256 of every file
("HASH  NAME" lines) and ends with the record. Any checkpoint resumes with or without --fsdp,
under any number of processes. Its size does not grow with the run: the metrics of the steps
done are in RUN/metrics.jsonl, not here. Checkpoints of earlier formats load: format 2 held the
model and optimizers in state.pt (but for --fsdp runs; COMPLETE: state.pt's hash alone), format
1 also the whole metrics history, which is ignored.

Loading never runs code from a checkpoint (a run's folder may come from a shared bucket):
state.pt is read with torch.load(weights_only=True), which builds tensors and plain Python
values only (and numpy's arrays, for the RNG state), and a sharded checkpoint's DCP metadata
through an allow-list (dcp_files.SafeReader).
"""

import random
import re
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from longpack import TrainingError, sha256_file, write_bytes
from training.checkpoints import dcp_files
from training.data.mixture import MixedOrder, history_until, same_until
from training.parallel import distributed, fsdp
from training.step import TrainState

# 3: the model and optimizers' tensors in DCP files for every run; 2: in state.pt (torch.save)
# but for --fsdp runs; 1 (no "format" key): 2 plus "history", every step's metrics record.
FORMAT = 3
STEP_NAME = re.compile(r"step-(\d{8})")
RECORD = "longpack checkpoint of step {}"  # COMPLETE's last line
INCOMPLETE = "not a complete checkpoint (no COMPLETE file)"
RECENT_HASHES = 16
# numpy's array and dtype, which np.random.get_state() holds: data, rebuilt without running code
NUMPY_GLOBALS = [(getattr(np, "_core", None) or np.core).multiarray._reconstruct, np.ndarray,
                 np.dtype, type(np.dtype(np.uint32))]  # np._core: numpy 2; np.core: numpy 1.26


def save(run: Path, step: int, s: TrainState, state: dict, keep_last: int,
         procs: distributed.Processes) -> Path | None:
    """Checkpoint step `step`: every process calls it (a sharded model's each write their
    part); rank 0 writes state.pt and COMPLETE. Returns the folder on rank 0."""
    final = run / f"step-{step:08d}"
    tmp = run / f".step-{step:08d}.tmp"
    if procs.main:
        run.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    distributed.barrier(procs)
    # A sharded model: every process writes its part, returning once all have written. Else
    # the first process holds the whole model and writes it alone, as the rest of the
    # checkpoint, so DDP's machines need no shared disk. The param_groups go in state.pt.
    sharded = fsdp.is_sharded(s.model)
    if sharded or procs.main:
        groups = dcp_files.save_parts(tmp, s.model, s.optimizers, distributed=sharded)
    if procs.main:
        torch.save({**state, "param_groups": groups}, tmp / "state.pt")
        files = sorted(p.name for p in tmp.iterdir())
        (tmp / "COMPLETE").write_text(
            "".join(f"{sha256_file(tmp / name)}  {name}\n" for name in files)
            + RECORD.format(step) + "\n")
        if final.exists():
            if not is_checkpoint(final):  # not this code's: never removed, even to write here
                shutil.rmtree(tmp, ignore_errors=True)
                raise TrainingError(f"{final} is in the way of this run's checkpoint and was not "
                                    "written by it; move it out of the run folder and resume")
            shutil.rmtree(final)
        tmp.rename(final)
        write_bytes(run / "latest", (final.name + "\n").encode())
        for old in to_remove([p.name for p in checkpoints(run)], final.name, keep_last):
            shutil.rmtree(run / old, ignore_errors=True)
    distributed.barrier(procs)
    return final if procs.main else None


def is_checkpoint(path: Path) -> bool:
    """Whether `path` is a checkpoint this code wrote (`not_a_checkpoint` says why not)."""
    return not_a_checkpoint(path) is None


def not_a_checkpoint(path: Path) -> str | None:
    """Why `path` is not a checkpoint this code wrote, or None: one is named step-NNNNNNNN and
    has a COMPLETE whose record names that step (or, before the record, hashes alone)."""
    name = STEP_NAME.fullmatch(path.name)
    complete = path / "COMPLETE"
    if name is None or path.is_symlink() or not path.is_dir():
        return "not a checkpoint folder of this run (step-NNNNNNNN)"
    if not complete.is_file():
        return INCOMPLETE
    try:
        lines = complete.read_text().strip().split("\n")
    except (OSError, UnicodeDecodeError):
        return "its COMPLETE file is not a checkpoint's"
    if lines[-1].startswith("longpack checkpoint"):
        if lines[-1] != RECORD.format(int(name.group(1))):
            return f"its COMPLETE records another step ({lines[-1]!r}): a copy, left as it is"
        return None
    if all(re.fullmatch(r"[0-9a-f]{64}( {2}\S.*)?", line) for line in lines):
        return None  # written before the record
    return "its COMPLETE file is not a checkpoint's"


def checkpoints(run: Path) -> list[Path]:
    """RUN's checkpoints (is_checkpoint), oldest first."""
    return sorted((p for p in run.glob("step-*") if is_checkpoint(p)), key=lambda p: p.name)


def to_remove(names: list[str], saved: str, keep_last: int) -> list[str]:
    """The checkpoints (sorted names) that go once `saved` is written: all but the newest
    keep_last up to it, and every later one (an abandoned continuation of the run: --resume
    never, or a resume from an older checkpoint, rewrites those steps, as metrics.jsonl's)."""
    upto = [n for n in names if n <= saved]
    return upto[:-keep_last] + [n for n in names if n > saved]


def load(path: Path, flag: str = "--resume", fix: str = "pass a complete checkpoint "
         "directory, auto or never") -> tuple[dict, Path]:
    """The checkpoint in `path`, after checking state.pt against COMPLETE (on the CPU: each
    process moves what it needs to its own device). `flag` named `path` and `fix` says what
    to give it instead, in the one line of an error."""
    try:
        state = _read(path)
    except Exception as e:  # --resume DIR: one line naming it, not a traceback
        raise TrainingError(f"{flag} {path}: {e}; {fix}") from None
    return _readable(state, path), path


def warn(line: str) -> None:
    """A note for the user on stderr, one line (the trainer passes its own log instead)."""
    print(f"warning: {line}", file=sys.stderr)


def load_latest(run: Path, say=warn) -> tuple[dict, Path] | None:
    """The newest sound checkpoint of RUN; `say` is told of each one skipped, in one line."""
    paths = sorted((p for p in run.glob("step-*") if STEP_NAME.fullmatch(p.name)), reverse=True)
    for n, path in enumerate(paths):
        try:
            problem = not_a_checkpoint(path)
            if problem:
                raise ValueError(problem)
            state = _read(path)
        except Exception as e:  # truncated, missing or unreadable: fall back to the one before
            say(f"skipping checkpoint {path}: {e}; " + ("using the one before it"
                if n + 1 < len(paths) else "it was the only one: none is left to use"))
            continue
        # sound but newer: refused, since falling back to an older one would undo steps
        return _readable(state, path), path
    return None


def _read(path: Path) -> dict:
    problem = damage(path) or (dcp_files.damage(path)
                               if dcp_files.is_sharded_checkpoint(path) else None)
    if problem:
        raise ValueError(problem)
    try:
        with torch.serialization.safe_globals(NUMPY_GLOBALS):
            return torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # a pickle asking for more than data: refused, not run
        raise ValueError(f"state.pt holds more than a checkpoint's data, which is never loaded "
                         f"(nothing in it was run): {dcp_files.refusal(e)}") from None


def damage(path: Path) -> str | None:
    """What is wrong with the checkpoint folder's files against its COMPLETE, or None."""
    complete = path / "COMPLETE"
    if not complete.is_file():
        return INCOMPLETE
    lines = complete.read_text(errors="replace").split("\n")
    listed = dict(reversed(line.split("  ", 1)) for line in lines if "  " in line)
    if not listed:  # a whole checkpoint: state.pt's sha256 alone
        listed = {"state.pt": lines[0].strip()}
    for name, digest in sorted(listed.items()):
        if not (path / name).is_file():
            return f"{name} is missing"
        if sha256_file(path / name) != digest:
            return f"{name} does not match its checksum"
    return None


def _readable(state: dict, path: Path) -> dict:
    if state.get("format", 1) > FORMAT:
        raise TrainingError(f"{path} was written by a newer longpack (checkpoint format "
                            f"{state['format']}, this one reads up to {FORMAT}); upgrade "
                            "longpack to resume it, or pass --resume never or another --out")
    return state


def find(run: Path, resume: str, say=warn) -> tuple[dict, Path] | None:
    """--resume auto: the newest sound checkpoint in the run, if any (a run whose every
    checkpoint is unreadable is refused: starting afresh would quietly drop them); never:
    none; else the checkpoint directory named."""
    if resume == "never":
        return None
    if resume == "auto":
        skipped = []
        found = load_latest(run, lambda line: (skipped.append(line), say(line)))
        if found is None and skipped:
            raise TrainingError(f"{run}: none of its {len(skipped)} checkpoint(s) can be read "
                                "(each named above); restore one, or pass --resume never to "
                                "start afresh")
        return found
    return load(Path(resume))


def capture(s: TrainState, step: int, data, order: MixedOrder, cfg) -> dict:
    """What a checkpoint after `step` steps holds (the state of this process)."""
    recent = range(max(0, step - RECENT_HASHES), step)
    # the model and optimizers: save() adds them to a whole checkpoint (a sharded one's parts
    # are written by every process)
    return {"format": FORMAT, "scaler": s.scaler.state_dict(), "rng": rng_state(), "step": step,
            "fingerprint": data.fingerprint, "seq": data.seq, "config": cfg.to_dict(),
            # what the ids mean: zoo eval refuses a build of another tokenizer by it
            "tokenizer": data.manifest["tokenizer"],
            "mixture": order.history(),
            # the model's config as built (preset + --model-arg): what resume, export and
            # generate rebuild it from
            "model_config": asdict(s.model.cfg),
            "recent_hashes": [(n, order.step_hash(n)) for n in recent]}


def check_model(found: tuple[dict, Path], cfg) -> None:
    """Refuse to resume a checkpoint of another model (its weights would not load)."""
    state, path = found
    was = state["config"]["model"]
    if was != cfg.model:
        raise TrainingError(f"{path} holds a {was} model and this run asks for --model "
                            f"{cfg.model}; pass --model {was} to resume it, or --resume never "
                            "or another --out to start a new run")
    was_opt = state["config"].get("optimizer", "adamw")
    if was_opt != cfg.optimizer:  # its state is another optimizer's: nothing of it would load
        raise TrainingError(f"{path} was trained with --optimizer {was_opt} and this run asks for "
                            f"--optimizer {cfg.optimizer}; pass --optimizer {was_opt} to resume "
                            "it, or --resume never or another --out to start a new run with "
                            f"{cfg.optimizer}")
    saved = state.get("model_config")  # absent in checkpoints before --model-arg
    if saved is not None:
        import archs

        wants = asdict(archs.config(cfg.model, **cfg.model_overrides()))
        differ = [f"{k} {saved[k]} -> {wants[k]}" for k in sorted(wants)
                  if k not in ("vocab_size", "checkpointing") and saved.get(k) != wants[k]]
        if differ:
            raise TrainingError(f"{path} holds the model with other settings ({'; '.join(differ)})"
                                "; pass the checkpoint's --model-arg values to resume it, or "
                                "--resume never or another --out to start a new run")


def check_data(found: tuple[dict, Path], data, order: MixedOrder) -> None:
    """Refuse a checkpoint of other shards, another --seq, another mixture before its step (a
    stage that starts at its step or later may change), or another order of rows."""
    state, path = found
    # checkpoints before mixtures: one build, drawn from at every step
    saved = state.get("mixture") or [[0, {state["fingerprint"]: 1.0}]]
    step = state["step"]
    if not same_until(saved, order.history(), step):
        if not data.mixed and len(saved) == 1:
            raise TrainingError(f"{path} was trained on other shards (fingerprint "
                                f"{state['fingerprint']}, these are {data.fingerprint}); pass "
                                "--resume never or the original --shards")
        raise TrainingError(f"{path} was trained on another mixture before its step {step} "
                            f"(stages {describe(saved, step)}; this run's "
                            f"{describe(order.history(), step)}); pass the original --shards, "
                            "--mix and --mix-stage (a new stage may start at a step >= "
                            f"{step}), or --resume never")
    if state["seq"] != data.seq:
        raise TrainingError(f"{path} was trained with --seq {state['seq']}, this run has "
                            f"{data.seq}; pass --seq {state['seq']} or --resume never")
    for step_no, h in state["recent_hashes"]:
        if order.step_hash(step_no) != h:
            raise TrainingError(f"resume check failed: step {step_no} would read other rows "
                                "than the checkpointed run did (seed or global batch changed?)")


def describe(history: list, step: int) -> str:
    """Stages before `step` in a line: 'from 0: 3f2a..=0.70 9c1b..=0.30'."""
    return "; ".join(f"from {start}: " + " ".join(f"{fp[:8]}={w:.2f}" for fp, w in mix.items())
                     for start, mix in history_until(history, step))


def restore(found: tuple[dict, Path], s: TrainState, cfg) -> int:
    """Load the checkpoint into the train state and the RNGs; returns its step."""
    state, path = found
    try:
        if dcp_files.is_sharded_checkpoint(path):
            dcp_files.load_into(path, s.model, s.optimizers, state.get("param_groups"),
                                     distributed=fsdp.is_sharded(s.model))
        else:  # a checkpoint of format 2 or before: the model and optimizers in state.pt
            dcp_files.load_whole_into(state, s.model, s.optimizers)
    except dcp_files.Unreadable as e:  # damaged past its COMPLETE, or crafted: nothing ran
        raise TrainingError(f"{path} cannot be read ({e}); resume from an earlier checkpoint "
                            "(--resume RUN/step-NNNNNNNN), or pass --resume never or another "
                            "--out to start afresh") from None
    except (RuntimeError, KeyError, ValueError) as e:  # other shapes: archs/ changed since
        raise TrainingError(f"{path}: its weights do not fit --model {cfg.model} as archs/ "
                            f"builds it now ({str(e).strip().splitlines()[0]}); pass --resume "
                            "never or another --out to start afresh") from None
    s.scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"])
    return state["step"]


def model_state(found: tuple[dict, Path]) -> dict[str, torch.Tensor]:
    """The checkpoint's model weights by name, whole, on the CPU (either format)."""
    state, path = found
    if dcp_files.is_sharded_checkpoint(path):
        return dcp_files.tensors(path, "model.")
    return state["model"]


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            # this process's device only: the others belong to other ranks
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
