#!/usr/bin/env python
"""The one report of tools/gpu_suite.sh: every figure against its target, markdown and JSON.

Reads what the suite's steps left in WORK: steps/NAME.json (exit code, seconds, time limit),
figures/NAME.jsonl (the figures of gpu_checks.py and gpu_runs.py), figures/archs.records.jsonl
and figures/loader.records.jsonl (bench_archs.py's and bench_train.py's --json rows, turned
into figures here), env.json and logs/NAME.log (the tail of a failed step's log goes into the
report). Writes OUT/gpu_report.md and OUT/gpu_report.json, each under a temporary name and
renamed. The suite runs it after every step, so a command cut short still leaves a report.

Every row of TARGETS is in the report, measured or not ("not measured: the step failed, timed
out or did not run"). Speed and memory targets hold on the GPU only: the CPU smoke run
reports them "not judged". Imports nothing but the standard library.

    python tools/gpu_report.py WORK OUT [--mode gpu|cpu-smoke]
"""

import argparse
import json
import os
import time
from pathlib import Path
from typing import NamedTuple

STEPS = ("env", "corpus", "zoo", "flex", "archs", "loader", "memory", "resume", "torchrun",
         "tests")
ZOO = ("neox-tiny", "moe-tiny", "mamba-tiny", "hybrid-tiny", "resonance-tiny")
BF16 = "the suite's bf16 tolerance"


class Target(NamedTuple):
    op: str  # ==, <=, >=, abs<=
    bound: float
    on_cpu: bool  # judged on the CPU smoke run too (correctness); else on the GPU only
    source: str  # where the target comes from
    no_cpu: str | None = None  # why the CPU smoke run cannot measure it at all


TARGETS = {
    "env.imports_ok": Target("==", 1, True, "every module the project imports loads"),
    **{f"zoo.{n}.{k}": Target(op, t, True, src) for n in ZOO for k, op, t, src in (
        ("bf16_logits_rel_diff", "<=", 5e-2, BF16),
        ("grads_finite", "==", 1, "issue 34: the archs tests on CUDA in bf16"),
        ("packed_vs_alone", "<=", 5e-2, f"a packed row = its documents alone; {BF16}"))},
    **{f"zoo.{n}.compiled_vs_eager": Target("<=", 5e-2, True, BF16) for n in ZOO[:2]},
    **{f"flex.{r}.out_rel_err": Target("<=", 1e-2, True, "issue 34: equal outputs (bf16: 1%)")
       for r in ("short", "long")},
    **{f"flex.{r}.grad_rel_err": Target("<=", 1e-2, True, "issue 34: equal outputs (bf16: 1%)",
                                        "FlexAttention has no backward on a CPU")
       for r in ("short", "long")},
    "archs.mfu_2k": Target(">=", 0.40, False, "issue 34: gpt-neox >= 350M at 2k, >= 40% MFU"),
    "archs.docs_32k_tokens_per_s": Target(">=", 35_000, False,
                                          "issue 34: neox-1.2b document-masked at 32k"),
    "archs.resonance_over_neox_from_16k": Target(
        ">=", 1.0, False, "issue 34: resonance faster than gpt-neox from 16k"),
    "loader.data_share": Target("<=", 0.02, False, "issue 34: loader <= 2% of a step"),
    "loader.real_over_synthetic": Target("<=", 1.02, False,
                                         "issue 5: real within 2% of synthetic"),
    **{f"memory.{f}.plan_error": Target("abs<=", 0.10, False,
                                        "issue 34: the plan within 10% of the measured peak")
       for f in ("gpt-neox", "moe", "mamba")},
    "resume.interrupted": Target("==", 1, True, "the run stopped by SIGTERM, exit 143"),
    "resume.losses_bitwise": Target("==", 1, True, "issue 34: bitwise on the same GPU"),
    "resume.weights_bitwise": Target("==", 1, True, "issue 34: bitwise on the same GPU"),
    **{f"torchrun.{k}.ok": Target("==", 1, True, "issue 34: torchrun DDP and --fsdp (NCCL)")
       for k in ("ddp", "fsdp", "fsdp_resume")},
    **{f"tests.{s}.{k}": Target("==", 0, True, "issue 34: the archs and train tests on CUDA")
       for s in ("archs", "train") for k in ("failed", "errors")},
}


def read_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line cut short by a kill
            continue
    return out


def archs_figures(records: list[dict], mode: str) -> list[dict]:
    """bench_archs.py --json rows -> figures: the MFU case, the 32k document-masked case, the
    scan and, from it, the smallest ratio of each family to gpt-neox at the lengths from 16k
    (the CPU smoke run: from its second length)."""
    out = []
    for r in records:
        what = (f"{r.get('model') or r.get('family')}, batch {r.get('batch', 1)} x {r['seq']}"
                + (f", documents of {r['doc_len']}" if r.get("doc_len") else "")
                + (", compiled" if r.get("compiled") else ", eager")
                + (f"; first step {r['first_step_seconds']:.1f} s" if "first_step_seconds" in r
                   else ""))
        if r.get("case") == "mfu":
            role = r.get("role", r["model"])
            value = r.get("mfu_nominal"), r.get("tokens_per_s")
            out.append(dict(name=f"archs.{role}", value=value[0], unit="MFU", what=what,
                            error=r.get("error")))
            out.append(dict(name=f"archs.{role}_tokens_per_s", value=value[1], unit="tokens/s",
                            what=what, error=r.get("error")))
            if r.get("doc_len"):
                out.append(dict(name=f"archs.{role}.mfu_useful", value=r.get("mfu_useful"),
                                unit="MFU", what="attention counted within documents only"))
        elif r.get("case") == "scan":
            out.append(dict(name=f"archs.scan.{r['family']}.{r['seq']}",
                            value=r.get("tokens_per_s"), unit="tokens/s", what=what,
                            error=r.get("error")))
    scan = {(r["family"], r["seq"]): r.get("tokens_per_s") for r in records
            if r.get("case") == "scan"}
    seqs = sorted({s for _, s in scan})
    start = 16384 if mode == "gpu" else (seqs[1] if len(seqs) > 1 else 0)
    for family in ("resonance", "mamba"):
        ratios = [scan[(family, s)] / scan[("gpt-neox", s)] for s in seqs if s >= start
                  and scan.get((family, s)) and scan.get(("gpt-neox", s))]
        if ratios:
            out.append(dict(name=f"archs.{family}_over_neox_from_16k", value=min(ratios),
                            unit="x", what=f"smallest tokens/s ratio at {start} and longer "
                            f"({len(ratios)} lengths)"))
    return out


def loader_figures(records: list[dict]) -> list[dict]:
    out = []
    for r in records[:1]:  # the first model's row: the suite measures one
        what = (f"{r['model']}, batch {r['batch']} x {r['seq']}, {r['precision']}"
                f"{', compiled' if r['compile'] else ''}, {r['steps']} steps")
        for key, unit in (("data_share", ""), ("real_over_synthetic", "x"),
                          ("tokens_per_s", "tokens/s"), ("mfu", "MFU")):
            if r.get(key) is not None:
                out.append(dict(name=f"loader.{key}", value=r[key], unit=unit, what=what))
    return out


def judge(figure: dict | None, target: Target | None, mode: str) -> str:
    if figure is None:
        if target and target.no_cpu and mode != "gpu":
            return f"not measured on a CPU ({target.no_cpu})"
        return "not measured"
    if figure.get("error") or not isinstance(figure.get("value"), int | float):
        return "error"
    if target is None:
        return "info"
    if mode != "gpu" and not target.on_cpu:
        return "not judged (CPU smoke)"
    v, bound = figure["value"], target.bound
    ok = {"==": v == bound, "<=": v <= bound, ">=": v >= bound,
          "abs<=": abs(v) <= bound}[target.op]
    return "PASS" if ok else "FAIL"


def step_rows(work: Path) -> list[dict]:
    rows = []
    for name in STEPS:
        path = work / "steps" / f"{name}.json"
        row = json.loads(path.read_text()) if path.exists() else {"name": name,
                                                                  "status": "not run"}
        log = work / "logs" / f"{name}.log"
        if row.get("status") not in ("ok", "not run", "skipped") and log.exists():
            row["log_tail"] = log.read_text(errors="replace").splitlines()[-25:]
        rows.append(row)
    return rows


def build(work: Path, mode: str) -> dict:
    figures = []
    for name in STEPS:
        figures += read_lines(work / "figures" / f"{name}.jsonl")
    figures += archs_figures(read_lines(work / "figures" / "archs.records.jsonl"), mode)
    figures += loader_figures(read_lines(work / "figures" / "loader.records.jsonl"))
    by_name = {f["name"]: f for f in figures}
    rows = []
    for name, target in TARGETS.items():
        f = by_name.get(name)
        rows.append({"name": name, "value": f and f.get("value"), "unit": f and f.get("unit"),
                     "what": f and (f.get("error") or f.get("what")),
                     "target": f"{target.op} {target.bound}", "source": target.source,
                     "verdict": judge(f, target, mode)})
    for f in figures:
        if f["name"] not in TARGETS:
            rows.append({"name": f["name"], "value": f.get("value"), "unit": f.get("unit"),
                         "what": f.get("error") or f.get("what"), "target": None,
                         "source": None, "verdict": judge(f, None, mode)})
    env_path = work / "env.json"
    verdicts = [r["verdict"] for r in rows if r["target"]]
    return {"suite": "tools/gpu_suite.sh", "mode": mode,
            "written": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "env": json.loads(env_path.read_text()) if env_path.exists() else {},
            "steps": step_rows(work), "figures": rows,
            "summary": {v: verdicts.count(v) for v in sorted(set(verdicts))}}


def number(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return "-" if v is None else str(v)


def value(row: dict) -> str:
    return f"{number(row['value'])} {row['unit'] or ''}".strip()


def markdown(report: dict) -> str:
    env = report["env"]
    lines = [f"# GPU suite report ({report['mode']}), {report['written']}", "",
             f"- device: {env.get('device', '?')}"
             + (f" ({env['memory_gib']} GiB, capability {env['capability']})"
                if "memory_gib" in env else ""),
             f"- driver: {env.get('nvidia_smi') or '-'}",
             f"- versions: python {env.get('python', '?')}, torch {env.get('torch_version', '?')}"
             f" (CUDA {env.get('torch_cuda', '-')}, cuDNN {env.get('cudnn', '-')}, NCCL "
             f"{env.get('nccl', '-')}), triton {env.get('triton', '-')}, numpy "
             f"{env.get('numpy_version', '?')}",
             f"- checkout: {env.get('commit', 'unknown')}; {env.get('cpus', '?')} CPUs",
             "- summary: " + ", ".join(f"{n} {v}" for v, n in report["summary"].items()),
             "", "## Steps", "", "| step | status | seconds | time limit |", "|---|---|---|---|"]
    for s in report["steps"]:
        lines.append(f"| {s['name']} | {s['status']} | {number(s.get('seconds'))} | "
                     f"{number(s.get('box'))} |")
    lines += ["", "## Targets", "", "| figure | value | target | verdict | what | target's source |",
              "|---|---|---|---|---|---|"]
    cell = lambda t: str(t or "-").replace("|", "/")  # noqa: E731
    for r in report["figures"]:
        if r["target"]:
            lines.append(f"| {r['name']} | {value(r)} | {r['target']} | {r['verdict']} | "
                         f"{cell(r['what'])} | {r['source']} |")
    lines += ["", "## Other figures", "", "| figure | value | what |", "|---|---|---|"]
    for r in report["figures"]:
        if not r["target"]:
            lines.append(f"| {r['name']} | {value(r)} | {cell(r['what'])} |")
    for s in report["steps"]:
        if s.get("log_tail"):
            lines += ["", f"## {s['name']}: {s['status']} (the log's last lines)", "", "```",
                      *s["log_tail"], "```"]
    return "\n".join(lines) + "\n"


def write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--mode", choices=("gpu", "cpu-smoke"), default="gpu")
    args = ap.parse_args()
    report = build(args.work, args.mode)
    args.out.mkdir(parents=True, exist_ok=True)
    write(args.out / "gpu_report.json", json.dumps(report, indent=1) + "\n")
    write(args.out / "gpu_report.md", markdown(report))


if __name__ == "__main__":
    main()
