#!/usr/bin/env python
"""The checks of tools/gpu_suite.sh that run the trainer (as `train` runs, in processes of
their own) and the tests; figures as tools/gpu_checks.py's (`emit`).

    resume    a compiled bf16 run SIGTERMed after its first steps and resumed, against a straight
              run: losses, batches and weights bitwise (a second straight run, only when they
              differ, tells nondeterministic kernels from a resume bug)
    torchrun  one process, then `torchrun --nproc-per-node 1` DDP and --fsdp (NCCL on CUDA) and
              the --fsdp checkpoint resumed: losses against the single process
    memory    per preset, the `train --dry-run --json` plan against the measured peak
              (torch.cuda.max_memory_allocated, metrics.jsonl's memory_gib; on a CPU the peak
              RSS of the run's process, which holds far more than the plan: not comparable)
    tests     the archs tests with CUDA as the default device (tools/gpu_pytest.py) and the
              train tests (the trainer takes the GPU by itself), pass/fail counts from JUnit XML
    train     the `train` command (torchrun runs this file: the project need not be installed)
"""

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gpu_checks
from gpu_checks import ROOT, device, emit


def train_cmd(*argv: str, torchrun: bool = False) -> list[str]:
    here = [str(Path(__file__).resolve()), "train", *argv]
    if torchrun:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "1", *here]
    return [sys.executable, *here]


def run_args(args, out: Path, *extra: str, model: str | None = None) -> list[str]:
    return ["--shards", args.shards, "--out", str(out), "--model", model or args.model,
            "--batch-size", str(args.batch), "--warmup", "2", "--lr", "1e-3",
            "--precision", args.precision,
            "--save-every", "1000000", "--eval-every", "1000000", "--eval-batches", "1",
            "--log-every", "1", "--report-to", "jsonl", "--workers", "1", *extra]


def records(run: Path) -> list[dict]:
    """metrics.jsonl's records; a line still being written (a run watched) is left out."""
    path = run / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else ():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in records(run) if "loss" in r]


def sh(cmd: list[str], log: Path) -> int:
    """Run `cmd`, its output to `log`; its exit code (a failure's tail is printed)."""
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    if rc:
        print(f"  {' '.join(cmd[:6])} ... exited {rc}:\n" + log.read_text()[-3000:], flush=True)
    return rc


def resume(args) -> None:
    import torch

    from longpack.training.checkpoints import checkpoint

    work = Path(args.work)
    steps = ["--max-steps", str(args.steps)] + (["--compile"] if args.compile else [])
    what = (f"{args.model}, batch {args.batch}, {args.precision}"
            f"{', compiled' if args.compile else ''}, {args.steps} steps")
    sh(train_cmd(*run_args(args, work / "straight", *steps, "--resume", "never")),
       work / "straight.log")
    with open(work / "interrupted.log", "w") as log:
        p = subprocess.Popen(train_cmd(*run_args(args, work / "resumed", *steps, "--resume",
                                                 "never")), stdout=log, stderr=subprocess.STDOUT,
                             cwd=ROOT)
        while p.poll() is None and len(records(work / "resumed")) < args.stop_after:
            time.sleep(0.005)
        interrupted = p.poll() is None
        p.send_signal(signal.SIGTERM)
        rc = p.wait()
    stopped = len(records(work / "resumed"))
    # train exits as the signal would have it killed: 128 + SIGTERM
    emit("resume.interrupted", interrupted and rc == 128 + signal.SIGTERM and stopped < args.steps,
         "",
         f"SIGTERM after {args.stop_after} steps' metrics: exit {rc}, stopped after {stopped} "
         f"of {args.steps} steps; {what}")
    sh(train_cmd(*run_args(args, work / "resumed", *steps)), work / "resumed.log")
    a, b = records(work / "straight"), records(work / "resumed")
    emit("resume.losses_bitwise", len(a) == args.steps and
         [(r["loss"], r.get("batch")) for r in a] == [(r["loss"], r.get("batch")) for r in b],
         "", f"{len(a)} and {len(b)} steps' losses and batch hashes")
    try:
        wa, wb = (checkpoint.model_state(checkpoint.load_latest(work / r))
                  for r in ("straight", "resumed"))
        same = wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    except Exception as e:  # a run that left no checkpoint
        print(f"  weights: {type(e).__name__}: {e}", flush=True)
        same = False
    emit("resume.weights_bitwise", same, "", "the final checkpoints' weights")
    if a and b and not (same and losses(work / "straight") == losses(work / "resumed")):
        sh(train_cmd(*run_args(args, work / "again", *steps, "--resume", "never")),
           work / "again.log")
        emit("resume.straight_twice_bitwise", losses(work / "again") == losses(work / "straight"),
             "", "two straight runs' losses: 0 = the device's kernels are not deterministic")


def torchrun(args) -> None:
    work = Path(args.work)
    steps = ["--max-steps", str(args.steps)]
    sh(train_cmd(*run_args(args, work / "one", *steps)), work / "one.log")
    one = losses(work / "one")
    what = f"{args.model}, batch {args.batch}, {args.precision}, {args.steps} steps"
    for name, extra in (("ddp", ()), ("fsdp", ("--fsdp",))):
        rc = sh(train_cmd(*run_args(args, work / name, *steps, *extra), torchrun=True),
                work / f"{name}.log")
        got = losses(work / name)
        emit(f"torchrun.{name}.ok", rc == 0 and len(got) == args.steps, "",
             f"torchrun --nproc-per-node 1{' --fsdp' if extra else ''}: exit {rc}; {what}")
        if got and len(got) == len(one):
            emit(f"torchrun.{name}.max_loss_diff", max(abs(x - y) for x, y in zip(got, one)), "",
                 "against one process without torchrun")
    more = ["--max-steps", str(args.steps + 2), "--fsdp"]
    rc = sh(train_cmd(*run_args(args, work / "fsdp", *more), torchrun=True),
            work / "fsdp-resume.log")
    emit("torchrun.fsdp_resume.ok", rc == 0 and len(records(work / "fsdp")) == args.steps + 2,
         "", f"the --fsdp run's sharded checkpoint resumed for 2 more steps: exit {rc}")


FAMILY_OF = {"neox": "gpt-neox", "moe": "moe", "mamba": "mamba", "resonance": "resonance",
             "hybrid": "moe"}


def memory(args) -> None:
    import torch

    from longpack.training.cli import train

    work = Path(args.work)
    on_gpu = torch.cuda.is_available()
    for preset in args.presets.split(","):
        family = FAMILY_OF.get(preset.split("-")[0], preset)
        out = work / preset
        argv = run_args(args, out, "--max-steps", "3", model=preset)
        plan_out = io.StringIO()
        try:
            with contextlib.redirect_stdout(plan_out), contextlib.redirect_stderr(io.StringIO()):
                train.main(args=[*argv, "--dry-run", "--json", "--world-size", "1"],
                           prog_name="train", standalone_mode=False)
            plan = json.loads(plan_out.getvalue())["memory_per_process"]["total"]
        except Exception as e:  # the next preset is still measured
            emit(f"memory.{family}.plan_error", None, "", f"{preset}: the dry run failed: "
                 f"{type(e).__name__}: {str(e)[:200]}")
            continue
        with open(work / f"{preset}.log", "w") as log:
            p = subprocess.Popen(train_cmd(*argv, "--resume", "never"), stdout=log,
                                 stderr=subprocess.STDOUT, cwd=ROOT)
            _, status, usage = os.wait4(p.pid, 0)  # this child's own peak RSS
            p.returncode = os.waitstatus_to_exitcode(status)
        peaks = [r["memory_gib"] * 2**30 for r in records(out) if "memory_gib" in r]
        measured = (max(peaks) if peaks else None) if on_gpu else usage.ru_maxrss * 1024
        what = (f"{preset}, batch {args.batch}, {args.precision}, exit {p.returncode}; measured: "
                + ("torch.cuda.max_memory_allocated" if on_gpu else
                   "peak RSS of the process (CPU: not comparable)"))
        emit(f"memory.{family}.plan_gib", plan / 2**30, "GiB", what)
        if measured is None:
            emit(f"memory.{family}.plan_error", None, "", f"the run recorded no memory: {what}")
            continue
        emit(f"memory.{family}.measured_gib", measured / 2**30, "GiB", what)
        emit(f"memory.{family}.plan_error", plan / measured - 1, "", "plan / measured - 1")


# -- tests ----------------------------------------------------------------------------------------

ARCHS_TESTS = ["tests/test_archs.py", "tests/test_moe.py", "tests/test_mamba.py",
               "tests/test_resonance.py"]
TRAIN_TESTS = ["tests/test_train.py", "tests/test_train_resume.py"]


def tests(args) -> None:
    import importlib.util
    import xml.etree.ElementTree as ET

    dev = device(args)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    # the plugins named here only: a machine's image may hold others that load its own stack
    # pyproject's addopts name pytest-xdist's flags, a plugin not loaded here unless below
    extra = ["-p", "no:cacheprovider", "-q", "-o", "addopts="]
    if importlib.util.find_spec("xdist") and not args.smoke:
        extra += ["-p", "xdist.plugin", "-n", str(min(8, os.cpu_count() or 1))]
    if importlib.util.find_spec("pytest_timeout"):
        extra += ["-p", "pytest_timeout", "--timeout", "120"]
    environ = {**os.environ, "LONGPACK_TEST_DEVICE": dev.type, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), str(ROOT),
                                              os.environ.get("PYTHONPATH", "")])}
    suites = {"archs": (ARCHS_TESTS, ["-p", "gpu_pytest"]), "train": (TRAIN_TESTS, [])}
    if args.smoke:
        suites["archs"][1].extend(["-k", "packed_row and neox-tiny and eval"])
        suites["train"][1].extend(["-k", "metrics_jsonl_has_every_step"])
    deadline = time.monotonic() + args.seconds
    for n, (name, (files, opts)) in enumerate(suites.items()):
        xml = work / f"{name}.xml"
        limit = (deadline - time.monotonic()) / (len(suites) - n)
        cmd = [sys.executable, "-m", "pytest", *files, *opts, *extra, f"--junitxml={xml}"]
        print("  " + " ".join(cmd), flush=True)
        try:
            with open(work / f"{name}.log", "w") as log:
                subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                               env=environ, timeout=max(limit, 10))
        except subprocess.TimeoutExpired:
            emit(f"tests.{name}.timed_out", 1, "", f"stopped after {limit:.0f} s")
        if not xml.exists():
            emit(f"tests.{name}.failed", None, "", "no JUnit report (see the log)")
            continue
        root = ET.parse(xml).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        bad = [f"{c.get('classname')}.{c.get('name')}" for c in suite.iter("testcase")
               if c.find("failure") is not None or c.find("error") is not None]
        where = f"{' '.join(files)} on {dev.type}"
        emit(f"tests.{name}.passed", counts["tests"] - counts["failures"] - counts["errors"]
             - counts["skipped"], "", where)
        emit(f"tests.{name}.skipped", counts["skipped"], "", where)
        emit(f"tests.{name}.failed", counts["failures"], "", ", ".join(bad[:12]) or where)
        emit(f"tests.{name}.errors", counts["errors"], "", where)


def main() -> None:
    if sys.argv[1:2] == ["train"]:  # as `train`, with its own flags
        from longpack.training.cli import train

        train.main(args=sys.argv[2:], prog_name="train")
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("check", choices=("resume", "torchrun", "memory", "tests"))
    ap.add_argument("--figures", default=os.environ.get("GPU_SUITE_FIGURES"))
    ap.add_argument("--smoke", action="store_true", help="toy sizes (the CPU smoke run)")
    ap.add_argument("--device", default=None, help="tests: cuda or cpu [cuda when there is one]")
    ap.add_argument("--work", default="gpu-suite-work")
    ap.add_argument("--shards", help="resume, torchrun, memory: the build")
    ap.add_argument("--model", default="neox-tiny")
    ap.add_argument("--presets", default="neox-350m,moe-500m,mamba-370m", help="memory")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--stop-after", type=int, default=2, help="resume: SIGTERM after N steps")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("GPU_SUITE_LIMIT", 130))
                    - 10, help="tests: the time for all of them [the step's limit - 10 s]")
    args = ap.parse_args()
    gpu_checks.FIGURES = args.figures
    Path(args.work).mkdir(parents=True, exist_ok=True)
    globals()[args.check](args)


if __name__ == "__main__":
    main()
