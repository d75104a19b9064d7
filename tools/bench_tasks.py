"""`tools/bench_pack.py --tasks N`: a build split into N tasks against the same build in one
process, on this machine, same corpus, same cores (issue 15).

Ray's own start-up is measured apart: a local head node is started once (`ray start --head` on
127.0.0.1, timed: the cluster a user already has), and every Ray build connects to it
(`--engine ray --ray-address`), so each Ray build's wall clock holds what a build on an existing
cluster costs (connecting, the workers' start and imports, each task's tokenizer load, the
placement phase, the merge) and nothing else. Runs alternate: the single-process build, the
Ray build, and the same N tasks as N plain processes (`--task-index I`, started together: the
cost of splitting without Ray). Every output is checked byte-identical to the single build.

Target: the Ray build's throughput >= 0.9 of the single-process build's with N = 2.
"""

import hashlib
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench_common import CpuWatch, pack_executable, verdict

TARGET_RAY_VS_SINGLE = 0.9


def _ray_executable() -> str:
    """The `ray` command beside this interpreter (the project venv), else the one on PATH."""
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.exists() else (shutil.which("ray") or "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _digest(out: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name != "manifest.json":
            h.update(p.relative_to(out).as_posix().encode() + p.read_bytes())
    m = json.loads((out / "manifest.json").read_text())
    m.pop("timings")
    m["settings"].pop("workers")  # recorded as given: a task here has fewer threads than one build
    h.update(json.dumps(m, sort_keys=True).encode())
    return h.hexdigest()


def _timed(cmds: list[list[str]], env: dict) -> tuple[float, float, list[int]]:
    """Run commands together; (wall seconds, CPU seconds of them all, return codes)."""
    watch = CpuWatch()
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for c in cmds]
    outputs = [p.communicate()[0].decode("utf-8", "replace") for p in procs]
    wall = time.perf_counter() - t0
    cpu, _ = watch.read()
    for p, out in zip(procs, outputs):
        if p.returncode:
            print(f"  failed ({p.returncode}): {' '.join(p.args)}\n{out[-2000:]}")
    return wall, cpu, [p.returncode for p in procs]


def run(corpus: Path, tokenizer: Path, work: Path, tasks: int, workers: int, repeat: int,
        env: dict, seq: int) -> list[tuple]:
    pack = pack_executable()
    # The cluster listens on 127.0.0.1 only; without a token (Ray 2.60's `ray start` and a
    # driver did not agree on ~/.ray/auth_token here).
    env = {**env, "RAY_AUTH_MODE": "disabled"}
    base = [pack, "build", "--dataset", "fineweb-edu", "--input", str(corpus), "--tokenizer",
            str(tokenizer), "--seq", str(seq), "--quiet"]
    ray_temp = work / "ray"
    port = _free_port()
    t0 = time.perf_counter()
    ray = _ray_executable()
    subprocess.run([ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                    f"--num-cpus={workers}", f"--temp-dir={ray_temp}", "--disable-usage-stats",
                    "--include-dashboard=false"], env=env, check=True, capture_output=True)
    ray_start = time.perf_counter() - t0
    per_task = max(1, workers // tasks)
    variants = {
        "single": lambda out: [[*base, "--out", str(out), "--workers", str(workers)]],
        f"ray x{tasks}": lambda out: [[*base, "--out", str(out), "--workers", str(per_task),
                                       "--tasks", str(tasks), "--engine", "ray",
                                       "--ray-address", f"127.0.0.1:{port}"]],
        f"processes x{tasks}": lambda out: [
            [*base, "--out", str(out), "--workers", str(per_task), "--tasks", str(tasks),
             "--task-index", str(i)] for i in range(tasks)],
    }
    results = {name: [] for name in variants}
    digests = {}
    try:
        for r in range(repeat):
            for name, cmds in variants.items():
                out = work / f"out-tasks-{name.replace(' ', '')}"  # out_names()
                shutil.rmtree(out, ignore_errors=True)
                wall, cpu, rcs = _timed(cmds(out), env)
                if any(rcs) or not (out / "manifest.json").exists():
                    continue
                m = json.loads((out / "manifest.json").read_text())
                tokens = m["counts"]["tokens"] - m["counts"]["documents"]
                # the build proper: from its first step (the single build's, or the first task
                # starting in its worker) to manifest.json; the rest of the wall clock is
                # start-up and end (Python's imports; for Ray, connecting, its worker processes'
                # start, disconnecting)
                built = m["timings"]["seconds"]
                results[name].append((wall, cpu, tokens, built))
                digests[name] = _digest(out)
                print(f"  round {r + 1}: {name:<14} {wall:6.2f} s  {tokens / wall / 1e6:6.3f} M "
                      f"tok/s  cpu {cpu:5.1f} s", flush=True)
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True)
        shutil.rmtree(ray_temp, ignore_errors=True)
    print(f"\n== {tasks} tasks against one process (best of {repeat}; --workers {workers} for "
          f"the single build, {per_task} per task)")
    print(f"  ray start --head (local, once; not in the Ray builds' time): {ray_start:.2f} s")
    best = {n: min(rs) for n, rs in results.items() if rs}
    single = best.get("single")
    rows = []
    print(f"  {'':<16} {'wall s':>7} {'M tok/s':>8} {'x single':>8}   {'build s':>7} "
          f"{'x single':>8} {'start+end s':>11}  {'cpu s':>6}")
    for name, (wall, cpu, tokens, built) in best.items():
        ratio = single[0] / wall if single else float("nan")
        ratio_built = single[3] / built if single else float("nan")
        same = "same bytes" if digests.get(name) == digests.get("single") else "DIFFERENT BYTES"
        print(f"  {name:<16} {wall:7.2f} {tokens / wall / 1e6:8.3f} {ratio:8.3f}   {built:7.2f} "
              f"{ratio_built:8.3f} {wall - built:11.2f}  {cpu:6.1f}  {same}")
        if name.startswith("ray"):
            rows.append((f"ray build, {tasks} tasks, x one process, end to end "
                         f"(>= {TARGET_RAY_VS_SINGLE})", f"{ratio:.3f}",
                         verdict(ratio >= TARGET_RAY_VS_SINGLE)))
            rows.append((f"ray build, {tasks} tasks, x one process, start-up apart "
                         f"(>= {TARGET_RAY_VS_SINGLE})", f"{ratio_built:.3f}",
                         verdict(ratio_built >= TARGET_RAY_VS_SINGLE)))
    print("  (build s: manifest timings.seconds, from the build's first step, or the first task's "
          "start, to manifest.json; start+end s: the rest of the wall clock)")
    return rows


def out_names(tasks: int) -> list[str]:
    """The folders `run` writes in its work directory."""
    return [f"out-tasks-{name}" for name in ("single", f"rayx{tasks}", f"processesx{tasks}")]
