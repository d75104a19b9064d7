"""The training loop, top to bottom: processes -> data -> model -> resume -> steps.

A run is a pure function of the config and the shards (the order is data/mixture.py's; the
models draw no random numbers while training): N steps straight and K + resume + N - K give
the same losses and weights, under any number of processes with the same global batch. What
a checkpoint holds is checkpoints/checkpoint.py's, the step step.py's. Under torchrun every
process runs this code on its slice of each step; rank 0 logs and saves.
"""

import contextlib
import dataclasses
import math
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path

import torch

from longpack import archs
from longpack.core import DataError, TrainingError, is_url, redact, staging_folder
from longpack.training.checkpoints import checkpoint, saving
from longpack.training.checkpoints.upload import RemoteRun
from longpack.training.config import TrainConfig
from longpack.training.console import Console
from longpack.training.data.loader import StepBatches, batches, model_inputs
from longpack.training.data.mixture import MixedOrder, Sources, check_resume
from longpack.training.evaluate import split_loss
from longpack.training.fits import check_memory
from longpack.training.init_from import begin
from longpack.training.metrics import MetricsLog, check_installed, duration, peak_flops
from longpack.training.optim import schedule_change
from longpack.training.parallel import distributed
from longpack.training.setup import open_data
from longpack.training.step import prepare, read_steps, train_step
from longpack.training.step_time import PROBE_FROM, StepTimes, long_steps, probe_step, step_floor

SHARD_CACHE = "shard-cache"  # in the run directory, without --cache


def train(cfg: TrainConfig, resume: str = "auto", log=print,
          stop_at: int | None = None) -> "History":
    """Train to cfg.max_steps, or stop early after step `stop_at` with a checkpoint (what a
    SIGTERM handler does; tests use it to interrupt a run). Returns the metrics history: on
    the main process every step's record, those before a resume read back from
    metrics.jsonl; on the others, the records of the steps this call ran; its `stopped_by`
    is the signal that stopped the run (None: it ran to its end, or to `stop_at`)."""
    with distributed.processes(group=cfg.fsdp) as procs:
        log = Console(log) if procs.main else (lambda _: None)  # a lost reader: lines dropped
        run, remote = run_folder(cfg)
        check_installed(cfg.report_to)
        # -- resume point (fetched from the bucket, if any) and its model: checked before the
        # data is opened; then the data, model, resume checked before the run starts. What a
        # failure here made under --out (a fetched checkpoint, the shard cache) goes again, so a
        # refused run leaves nothing behind ------------------------------------------------------
        with removed_on_failure(run):
            saving.check_names(run)  # names a save writes: refused now, not after steps
            resume = fetch_remote_checkpoint(run, remote, resume, procs)
            found = same_on_every_process(checkpoint.find(run, resume, log), run, remote, procs, log)
            if found:
                checkpoint.check_model(found, cfg)
            with together_if(cfg.init_from, procs):  # SOURCE may be amiss on one machine
                init = begin(cfg, found, log)  # --init-from: checked now, its weights read below
            with distributed.failing_together(procs):  # a build amiss on one machine's disk
                data, cfg, order = open_data(cfg, Path(cfg.cache or run / SHARD_CACHE),
                                             procs.world, log)
            if found:
                check_resume(found, data, order, cfg)
            start = found[0]["step"] if found else 0
            last, cut_by = order.last_step(cfg.max_steps)  # --max-epochs may end the run sooner
            if cut_by is not None and (start > last or last == 0):
                name = data.names[cut_by]
                raise DataError(f"--max-epochs: {name} reaches it at step {last}"
                                + (f", and the run is at step {start} already" if start else
                                   ", before any step") + f"; raise {name}'s --max-epochs")
            saving.check_steps_free(run, start, last)  # what a save would refuse, refused now
            device = procs.device
            if device.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
            torch.manual_seed(cfg.seed)  # the same initial weights on every rank
            vocab = init.vocab_size if init else data.manifest["tokenizer"]["vocab_size"]
            check_memory(cfg, vocab, data.seq - 1, device)  # one line, before any allocation
            model = archs.build(cfg.model, vocab_size=vocab, **cfg.model_overrides).to(device)
            with together_if(init, procs):  # whole on every process, before DDP or FSDP
                if init:
                    init.load_into(model)
            state = prepare(model, cfg, procs)  # optimizers, grad scaler, DDP, compile
            step = checkpoint.restore(found, state, cfg) if found else 0
        # -- the run starts: its directory and metrics ------------------------------------------
        run.mkdir(parents=True, exist_ok=True)
        step_tokens = order.global_batch * (data.seq - 1)
        run_id = (found and found[0].get("run_id")) or uuid.uuid4().hex[:16]  # W&B's run id
        began = init.record if init else found and found[0].get("began_from")
        metrics = MetricsLog(run, cfg, resolved_config(cfg, model, data, procs.world, order,
                                                       step_tokens, began),
                             run_id) if procs.main else None
        # the records of the steps before `step`; lines of later ones (a crash, --resume never)
        # go, to be written again
        history = History(metrics.truncate(step) if metrics else [])
        if found:
            log(f"resumed from {found[1]} at step {step}")
            change = schedule_change(found[0]["config"], cfg, step)
            if change:
                log(change)
        wanted = cfg.eval_batches * cfg.batch_size
        for name, val in data.vals:
            if val is None:
                log(f"{name}: the build has no val rows: the run reports no val loss for it")
            elif len(val) < wanted:  # a val loss of a sample or two is noise, not a measure
                log(f"{name}: the build's val split holds {len(val)} sample"
                    f"{'s' if len(val) > 1 else ''} of the {wanted} an evaluation takes "
                    "(--eval-batches x --batch-size): its val loss is of those alone")
        if device.type == "cpu" and cfg.precision != "fp32":
            log(f"--precision {cfg.precision} on a CPU: a CPU without {cfg.precision} matrix "
                "units emulates it, often slower than fp32")
        batches_of = StepBatches(order, data.train, procs.rank, procs.world, cfg.batch_size,
                                 cfg.grad_accum)
        peak = peak_flops(device)
        if cut_by is not None:
            name = data.names[cut_by]
            log(f"{name} reaches --max-epochs at step {last}: the run stops there (of "
                f"{cfg.max_steps} steps)" if step < last else
                f"{name} reached --max-epochs at step {last}: the run is complete")
        eta = Eta(last)
        skips = SkippedSteps(cfg.max_skipped_steps, cfg.precision)
        times = StepTimes(step_floor(model, data.seq, cfg, device))
        if step < last:  # said before step 0, which may take a while (compiling, a GPU warming)
            log(f"training {cfg.model} ({model.num_params():,} parameters) for steps {step} to "
                f"{last - 1} of {order.global_batch} x {data.seq - 1} tokens on {procs.world} "
                f"{device.type} process{'es' if procs.world > 1 else ''}"
                + (": the first step compiles the model" if cfg.compile else ""))
            if (times.floor or 0) >= PROBE_FROM and procs.world == 1 and not cfg.fsdp \
                    and not cfg.compile:  # a compiled model would compile for the probe's shape
                times.about = probe_step(state, model, data.train, cfg, device)
            for line in long_steps(times.floor, times.about, last - step, model, data.seq, cfg,
                                   device):
                log(line)

        def save_checkpoint(step: int) -> None:
            check_weights(model, step, run, procs)
            with distributed.failing_together(procs):
                if procs.main and remote:
                    remote.wait()  # the previous checkpoint's upload, if still running
            saved = saving.save(run, step, state, checkpoint.capture(
                state, step, data, order, cfg, run_id, began), cfg.keep_last, procs)
            if procs.main and remote:  # its failure is seen at the next wait
                remote.submit(saved, run, cfg.keep_last)  # in the background
        # -- steps: SIGINT/SIGTERM/SIGHUP finish the step in hand, save, and return (the CLI exits 0);
        # a second one aborts (the last complete checkpoint stays) ------------------------------
        with stop_requested(log, times.left) as stop, uploads_finished(remote, log), \
                contextlib.closing(metrics) if metrics else contextlib.nullcontext(), \
                contextlib.closing(batches(batches_of, step, last, cfg.workers,
                                           cfg.prefetch)) as stream:
            pending = []  # the steps since the numbers were last read: (record, StepResult, t0)
            stopping = False
            if last == 0 and not found:  # --max-steps 0: a run that is its starting weights
                log("--max-steps 0: no step trained; the starting weights saved as step 0"
                    + (f" (from {cfg.init_from})" if init else " (random ones)"))
                save_checkpoint(0)
            while step < last:
                t0 = times.started()
                micro_batches = [model_inputs(next(stream), device, cfg.compile)
                                 for _ in range(cfg.grad_accum)]
                waited = time.perf_counter() - t0
                out = train_step(state, micro_batches, step, cfg, procs)
                record = {"step": step, "lr": out.lr, "tokens": (step + 1) * step_tokens,
                          "batch": order.step_hash(step), "data_seconds": waited}
                if device.type == "cuda":
                    record["memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
                if data.mixed:
                    record.update(source_counts(data, order, step + 1))
                pending.append((record, out, t0))
                evaluating = (step + 1) % cfg.eval_every == 0 or step + 1 == last
                step += 1
                # The step's numbers stay on the device until a logged step, an evaluation or a
                # checkpoint: then every pending step's are read in one copy, and the processes
                # agree on a signal (one process alone reads its own flag at every step).
                stopping = stop_at is not None and step >= stop_at
                due = step % cfg.save_every == 0 or step == last  # a checkpoint
                reading = (step - 1) % cfg.log_every == 0 or evaluating or due or stopping
                if procs.world == 1 or reading:
                    stopping = stopping or distributed.anyone(stop.requested, procs)
                if not (reading or stopping):
                    continue
                records = finished(pending, model, data, step_tokens, peak, procs.world)
                pending = []
                if evaluating:
                    records[-1].update(evaluate(model, data, cfg, procs) or {})
                with distributed.failing_together(procs):  # metrics.jsonl: rank 0's alone
                    for record in records:
                        times.took(record["seconds"])
                        record.update(eta.after(record["step"]))
                        skips.count(record)
                        history.append(record)
                        if metrics:
                            metrics.write(record)
                        if "console" in cfg.report_to and (record["step"] % cfg.log_every == 0
                                                           or "val_loss" in record):
                            log(console_line(record, last))
                        if record.get("skipped"):  # on every process: each stops at the limit
                            line = skips.after(record, run)
                            log(line)
                if due or stopping:
                    save_checkpoint(step)
                if stopping:
                    # another process's signal stopped this one: as a scheduler's SIGTERM
                    history.stopped_by = stop.signal or (None if stop_at else signal.SIGTERM)
                    break
        if stopping:  # the last line, after the uploads' (the command then exits 128 + signal)
            log(f"stopped at step {step}: re-run the same command to resume")
        return history


def finished(pending: list, model, data: Sources, step_tokens: int, peak,
             world: int) -> list[dict]:
    """The pending steps' records, their device numbers read in one copy (read_steps). Their
    time is the interval's wall clock shared out evenly (a GPU's steps run behind the CPU's
    queueing of them). A step whose update was skipped has `skipped` true, and its numbers
    that are not finite as None (JSON has no NaN), named in `nonfinite`."""
    numbers = read_steps([out for _, out, _ in pending])
    seconds = (time.perf_counter() - pending[0][2]) / len(pending)
    records = []
    for (record, _, _), n in zip(pending, numbers):
        done = {"step": record.pop("step"), "loss": n["loss"], **loss_terms(n["terms"]),
                "targets": n["targets"], "lr": record.pop("lr"), "grad_norm": n["grad_norm"],
                "tokens": record.pop("tokens"), "batch": record.pop("batch"),
                "seconds": seconds, "data_seconds": record.pop("data_seconds"),
                "tokens_per_second": step_tokens / seconds}
        if peak:
            flops = model.flops_per_token(data.seq - 1) * step_tokens
            done["mfu"] = flops / seconds / (peak * world)
        if n["skipped"]:
            bad = [k for k, v in done.items() if isinstance(v, float) and not math.isfinite(v)]
            done.update({k: None for k in bad}, skipped=True, nonfinite=bad)
        records.append({**done, **record})  # then memory_gib, each source's counts
    return records


class SkippedSteps:
    """The steps whose update was skipped for a non-finite loss or gradient norm (train_step
    skips them on the device; their records say so when next read): each is said, and
    --max-skipped-steps of them in a row stop the run. Seen when the steps' numbers are read
    (every --log-every steps), so a run may skip up to --log-every updates more before it
    stops; the weights stay as they were before the first."""

    # fp16 overflows in a row that stop a run: its scaler halves the scale at each, from 2**16,
    # so by then a gradient overflows at a scale of 2**-24 (fp16's least), at any scale at all
    OVERFLOWS_LIMIT = 40

    def __init__(self, limit: int, precision: str):
        self.limit, self.in_a_row, self.total, self.overflows_in_a_row = limit, 0, 0, 0
        # fp16's overflowed gradients (a finite loss) are its scaler's routine while it finds
        # its scale: skipped, said, but no step towards the limit (OVERFLOWS_LIMIT's instead)
        self.overflows = precision == "fp16"

    def count(self, record: dict) -> None:
        skipped = record.get("skipped", False)
        overflow = skipped and self.overflows and "loss" not in record["nonfinite"]
        counted = skipped and not overflow
        self.in_a_row = self.in_a_row + 1 if counted else 0
        self.overflows_in_a_row = self.overflows_in_a_row + 1 if overflow else 0
        self.total += skipped
        if skipped:
            record["skipped_in_a_row"] = self.in_a_row

    def after(self, record: dict, run: Path) -> str:
        """The console's line for a skipped step; at the limit, the run's end (raised)."""
        names = [k.replace("_", " ") for k in record["nonfinite"]] or ["loss"]
        what = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        verb = "are" if len(names) > 1 else "is"
        counts = (f"{self.in_a_row} in a row, {self.total} in this run; --max-skipped-steps "
                  f"{self.limit}" if self.in_a_row else
                  f"fp16's overflow, its scale lowered; {self.total} in this run")
        line = (f"step {record['step']}: the {what} {verb} not finite: its update was skipped "
                f"({counts})")
        if self.overflows_in_a_row >= self.OVERFLOWS_LIMIT:
            raise TrainingError(
                f"{self.overflows_in_a_row} steps in a row (to step {record['step']}) had fp16 "
                "gradients that overflow, the scale lowered at each: they are not finite at any "
                f"scale, and the run stops; {saving.resume_point(run)} (resume with a lower "
                "--lr, or --precision bf16)")
        if self.in_a_row >= self.limit:
            raise TrainingError(
                f"{self.in_a_row} steps in a row (to step {record['step']}) had a loss or "
                f"gradient norm that is not finite and were skipped: the run stops; "
                f"{saving.resume_point(run)} (resume with a lower --lr, or look at those "
                "steps' batches in metrics.jsonl)")
        return line


def check_weights(model, step: int, run: Path, procs) -> None:
    """No checkpoint of weights that are not finite (an update skipped for a non-finite
    gradient keeps them finite; this stops anything else): the first such parameter is named,
    and the run stops before it saves. One host read, at a save."""
    from torch.distributed.tensor import DTensor

    names, params = zip(*model.named_parameters())
    local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
    good = torch.stack([torch.isfinite(p.detach()).all() for p in local])
    bad = distributed.anyone(not bool(good.all()), procs)
    if bad:
        first = next((n for n, ok in zip(names, good.tolist()) if not ok), "on another process")
        raise TrainingError(f"the weights ({first}) are not finite at step {step}: no "
                            f"checkpoint is written; {saving.resume_point(run)} (resume with "
                            "a lower --lr)")


def run_folder(cfg: TrainConfig) -> tuple[Path, RemoteRun | None]:
    """(the local run directory, the bucket it goes to): --out, or for an --out URL a local
    folder of its own (storage.staging_folder); --upload or an --out URL reached now, so a
    wrong endpoint, bucket or credential stops the run before it starts."""
    if is_url(cfg.out):
        return staging_folder(cfg.out, cfg.staging) / "run", RemoteRun(cfg.out)
    return Path(cfg.out), RemoteRun(cfg.upload) if cfg.upload else None


def fetch_remote_checkpoint(run: Path, remote: RemoteRun | None, resume: str, procs) -> str:
    """--resume as checkpoint.find takes it, once what it names in a bucket is in RUN: auto
    with a bucket fetches the bucket's newest complete checkpoint when RUN has none as new (a
    fresh machine); a checkpoint's URL is fetched into RUN. Under torchrun every process
    fetches for itself (each machine has its own disk; on one machine the first to finish
    puts it in place, fetch renames a whole folder), and only rank 0, which writes
    metrics.jsonl, fetches that."""
    if is_url(resume):
        parent, _, name = resume.rstrip("/").rpartition("/")
        return str(RemoteRun(parent).fetch(name, run))
    if resume == "auto" and remote is not None:
        remote.fetch_newest(run, metrics=procs.main)
    return resume


def same_on_every_process(found, run: Path, remote: RemoteRun | None, procs, log):
    """The checkpoint all processes resume from: the oldest of each one's newest. They differ
    when the machines do not share a disk and rank 0's newest checkpoint never reached the
    bucket (its upload was cut short): the others fetched the one before, which rank 0 still
    has (--keep-last) or fetches too. Its later checkpoints then go at the next save, as any
    abandoned continuation's (checkpoint.to_remove)."""
    step = found[0]["step"] if found else 0
    agreed = distributed.smallest(step, procs)
    if agreed == step:
        return found
    log(f"resuming at step {agreed}, not {step}: the newest checkpoint every process has")
    if agreed == 0:
        return None
    name = f"step-{agreed:08d}"
    if not (run / name / "COMPLETE").is_file() and remote is not None:
        remote.fetch(name, run)
    if not (run / name / "COMPLETE").is_file():
        raise TrainingError(f"the processes of this run resume from step {agreed} (another "
                            f"machine's newest checkpoint), and {run / name} is missing here "
                            "and in the bucket; resume them from one checkpoint directory "
                            "(--resume DIR) or --resume never")
    return checkpoint.load(run / name)


def together_if(needed, procs):
    """distributed.failing_together where `needed` (the same on every process), else nothing:
    what only --init-from reads is agreed on only then."""
    return distributed.failing_together(procs) if needed else contextlib.nullcontext()


@contextlib.contextmanager
def uploads_finished(remote: RemoteRun | None, log):
    """The last checkpoint's upload is waited for before the run ends, also when it fails (the
    run's own error is the one raised)."""
    try:
        yield
    except BaseException:
        if remote is not None:
            with contextlib.suppress(Exception):
                remote.wait()
        raise
    if remote is not None:
        remote.wait()
        log(f"checkpoints uploaded to {redact(remote.store.url)}")


class History(list):
    """The run's records, and the signal that stopped it before its end (None if none did):
    the command exits 128 + it, as a process killed by it would (130 for Ctrl+C)."""
    stopped_by: int | None = None


class StopRequest:
    requested = False
    signal: int | None = None  # the first stop signal this process received


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_requested(log=print, left=lambda: ""):
    """SIGINT, SIGTERM and SIGHUP (a closed terminal) set `.requested` instead of stopping the
    process, while the block runs, and say so at once; a second SIGINT or SIGTERM raises
    KeyboardInterrupt there and then (a step of an hour need not be waited for; the last
    complete checkpoint stays, as after a kill). A signal the process was started ignoring
    stays ignored: `nohup train ...` asked that a closed terminal not stop it. Handlers can be
    set in the main thread only; elsewhere nothing is caught."""
    stop, previous = StopRequest(), {}
    if threading.current_thread() is threading.main_thread():
        def handler(sig, _frame):
            if stop.requested and sig != signal.SIGHUP:
                log("stopped at once: re-run the same command to resume from the last "
                    "complete checkpoint")
                raise KeyboardInterrupt
            if not stop.requested:
                log(f"stopping after the step in hand{left()}, with a checkpoint (Ctrl+C again "
                    "to stop at once)")
                stop.signal = sig
            stop.requested = True
        previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS
                    if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def removed_on_failure(run: Path):
    """If the block fails, remove what it made under the run directory: the directory itself,
    or in an existing run the shard cache or a build's folder in it (shard-cache/FINGERPRINT of
    other shards, before the resume refuses them). A --cache elsewhere may be shared with
    other runs and is left alone."""
    cache = run / SHARD_CACHE
    made_run, made_cache = not run.exists(), not cache.exists()
    before = set(cache.iterdir()) if cache.is_dir() else set()
    try:
        yield
    except BaseException:
        if made_run or made_cache:
            shutil.rmtree(run if made_run else cache, ignore_errors=True)
        elif cache.is_dir():
            for path in set(cache.iterdir()) - before:
                shutil.rmtree(path, ignore_errors=True)
        raise


def evaluate(model, data: Sources, cfg: TrainConfig, procs) -> dict | None:
    """Loss and perplexity over the first eval_batches * batch_size samples of each source's
    val: the sum of the next-token loss (model.loss's `ce`, as the record's lm_loss; hence
    `val_lm_loss`, equal to `val_loss`) of every real target over their number (all processes
    together; padding counts for nothing), so it does not depend on how the samples are
    batched. The batches are shared out over the processes, each running as many forwards
    (split_loss pads with masked batches: a sharded forward is collective). A mixture also
    reports each source's (`val_loss/NAME`); `val_loss` is over all of them. None without val
    rows, or if those samples are padding only."""
    out, loss_sum, targets = {}, 0.0, 0
    for name, val in data.vals:
        if val is None:
            continue
        n = min(len(val), cfg.eval_batches * cfg.batch_size)
        part_sum, part = split_loss(model, val, n, cfg.batch_size, procs.device, cfg.doc_mask,
                                    cfg, procs.rank, procs.world,
                                    reading=lambda: distributed.failing_together(procs))
        part_sum, part = distributed.total(part_sum, procs), round(distributed.total(part, procs))
        if part and data.mixed:
            out[f"val_loss/{name}"] = part_sum / part
        loss_sum, targets = loss_sum + part_sum, targets + part
    if not targets:
        return None
    loss = loss_sum / targets
    return {"val_loss": loss, "val_lm_loss": loss, "val_ppl": math.exp(min(loss, 50.0)),
            "val_targets": targets, **out}


def loss_terms(terms: dict) -> dict:
    """A step's loss terms (StepResult.terms, model.loss's names) as the record's: `lm_loss`
    (the next-token cross-entropy, `ce`: what the val loss measures), `aux_loss` (the weighted
    sum of the auxiliary terms: loss = lm_loss + aux_loss) and each of those terms, unweighted,
    as aux/NAME (MoE: aux/balance, aux/z_loss, aux/mtp, aux/mod_predictor, aux/dropped)."""
    out = {"lm_loss": terms.get("ce"), "aux_loss": terms.get("aux")}
    out.update({f"aux/{k}": v for k, v in terms.items() if k not in ("ce", "aux")})
    return out


def resolved_config(cfg: TrainConfig, model, data: Sources, world: int, order,
                    step_tokens: int, began: dict | None = None) -> dict:
    """What W&B records as the run's config: the settings as the run resolved them
    (--total-tokens as max_steps), and what they came to: the processes, the sample length,
    the global batch, tokens per step, the model's full config and its parameters, the
    tokenizer the ids were made with (its sha256: what the checkpoints hold builds to), and
    the weights it began from (--init-from's record; None: random ones)."""
    tok = data.manifest["tokenizer"]
    return {**cfg.to_dict(), "world_size": world, "seq": data.seq,
            "global_batch": order.global_batch, "tokens_per_step": step_tokens,
            "model_config": dataclasses.asdict(model.cfg), "params": model.num_params(),
            "tokenizer": {k: tok.get(k) for k in ("name", "sha256", "vocab_size", "eos_id")},
            "began_from": began}


def source_counts(data: Sources, order: MixedOrder, steps: int) -> dict:
    """What each source of a mixture gave to the first `steps` steps: rows, tokens (its rows'
    predictions, as the record's `tokens`) and epochs, e.g. rows/web."""
    rows = order.rows_before(steps)
    out = {}
    for k, name in enumerate(data.names):
        out[f"rows/{name}"] = int(rows[k])
        out[f"tokens/{name}"] = int(rows[k]) * (data.seq - 1)
        out[f"epochs/{name}"] = float(rows[k] / order.sizes[k])
    return out


class Eta:
    """Time left from the wall-clock pace of this process's steps (evaluations and checkpoint
    saves included), leaving out its first step, which pays for warm-up and compilation."""

    def __init__(self, total: int):
        self.total, self.first_step, self.t_first = total, None, None

    def after(self, step: int) -> dict:
        """{progress, eta_seconds} once `step` (0-based) is done; eta None until the pace is
        known (the first step of a process)."""
        now = time.perf_counter()
        if self.t_first is None:
            self.first_step, self.t_first = step, now
        done, left = step - self.first_step, self.total - (step + 1)
        eta = 0.0 if not left else left * (now - self.t_first) / done if done else None
        return {"progress": (step + 1) / self.total, "eta_seconds": eta}


def console_line(r: dict, total: int) -> str:
    """`step 40 (41/1000, 4.1%) loss ... lm ... lr ...`: the step as metrics.jsonl numbers it
    (from 0), then the steps done of the run's and their share."""
    extra = f" val {r['val_lm_loss']:.4f}" if "val_lm_loss" in r else ""
    extra += f" mfu {100 * r['mfu']:.1f}%" if "mfu" in r else ""
    extra += f" mem {r['memory_gib']:.1f} GiB" if "memory_gib" in r else ""
    eta = r.get("eta_seconds")
    extra += f" ETA {'-' if eta is None else duration(eta)}"  # "-": known after one more step

    def number(key):
        return "-" if r.get(key) is None else f"{r[key]:.4f}"  # "-": padding only, or skipped

    losses = f"loss {number('loss')} lm {number('lm_loss')}"
    if any(k.startswith("aux/") for k in r):  # a model with auxiliary terms (MoE)
        losses += f" aux {number('aux_loss')}"
    width = len(str(total))
    return (f"step {r['step']:>{width}} ({r['step'] + 1:>{width}}/{total}, "
            f"{100 * r['progress']:.1f}%) {losses} lr {r['lr']:.2e} "
            f"grad {'-' if r['grad_norm'] is None else format(r['grad_norm'], '.2f')} "
            f"{r['tokens_per_second']:,.0f} tok/s{extra}")
