#!/usr/bin/env python
"""The checks of tools/gpu_suite.sh that look at the device and the models, one subcommand each
(tools/gpu_runs.py has those that run the trainer and the tests). Every figure is appended to
$GPU_SUITE_FIGURES (or --figures) as a JSON line {"name", "value", "unit", "what"} as soon as it
is measured, so a check stopped by its time limit keeps what it had measured;
tools/gpu_report.py holds the targets and judges them. --smoke: toy sizes, for the CPU run.

    env       device, versions, driver; whether every module the project imports is there
    corpus    a hermetic build: words in JSON lines, a byte-level tokenizer named gpt2.tiktoken
              (GPT-2's 50,257 ids, so the models' heads have their real size), memmap rows
    zoo       each tiny family on the device under bf16 autocast: logits against fp32, finite
              gradients, a packed row against its documents alone (FlexAttention on CUDA),
              torch.compile against eager (each case in a child process: `compiled`; when
              one fails on CUDA, the cases that tell what it depends on)
    ssd       Mamba's scan through flash-linear-attention's kernel (archs/mamba.py fla_scan, the
              `gpu` extra) against the PyTorch reference ssd_chunked: outputs and gradients,
              rows of documents, and mamba-tiny's loss and gradients either way; run at the end
              of `zoo` too. Without CUDA or the package it records why and measures nothing
              (the speed against gpt-neox, 4k to 64k, is bench_archs' GPU scan, `archs`)
    flex      FlexAttention (compiled, as in a compiled model) against causal SDPA per document
              (attention's CPU path, run on the same device) at a short and a long row: outputs,
              gradients, time; uncompiled FlexAttention's time (a run without --compile)
"""

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FIGURES = None


def emit(name: str, value, unit: str = "", what: str = "") -> None:
    if isinstance(value, bool):
        value = int(value)
    line = {"name": name, "value": value, "unit": unit, "what": what}
    print(f"  {name} = {value} {unit}  {what}", flush=True)
    if FIGURES:
        with open(FIGURES, "a") as f:
            f.write(json.dumps(line) + "\n")


def device(args):
    import torch

    return torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))


# -- env ------------------------------------------------------------------------------------------

NEEDED = ("torch", "numpy", "zstandard", "xxhash", "tiktoken", "pyarrow", "click", "pytest",
          "longpack.training.loop", "longpack.pipeline.build", "archs")


def env(args) -> None:
    import importlib
    import importlib.metadata
    import platform

    info = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "commit": args.commit or "unknown"}
    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                info[f"{name}_version"] = importlib.metadata.version(name)
        except Exception as e:  # a missing wheel, or one that does not load
            missing.append(f"{name} ({type(e).__name__}: {str(e)[:120]})")
    info = {k: v for k, v in info.items() if v is not None}
    info["missing"] = missing
    try:
        import torch

        info.update(torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(device=p.name, capability=f"{p.major}.{p.minor}",
                        memory_gib=round(p.total_memory / 2**30, 1),
                        multiprocessors=p.multi_processor_count,
                        cudnn=torch.backends.cudnn.version(),
                        nccl=".".join(map(str, torch.cuda.nccl.version())))
        else:
            info["device"] = f"CPU ({platform.processor() or platform.machine()})"
        import triton

        info["triton"] = triton.__version__
    except Exception as e:
        info.setdefault("notes", []).append(f"{type(e).__name__}: {str(e)[:200]}")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = smi.stdout.strip()
    Path(args.out).write_text(json.dumps(info, indent=1) + "\n")
    emit("env.imports_ok", not missing, "", "; ".join(missing) or "every module imports")


# -- corpus ---------------------------------------------------------------------------------------

def corpus(args) -> None:
    import base64

    import numpy as np

    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    ranks = work / "gpt2.tiktoken"
    ranks.write_bytes(b"\n".join(base64.b64encode(bytes([b])) + b" " + str(b).encode()
                                 for b in range(256)) + b"\n")
    rng = np.random.default_rng(0)
    words = np.array("the of and long context packed rows document model alpha beta".split())
    with open(work / "corpus.jsonl", "w") as f:
        size = 0
        while size < args.tokens:  # a byte is a token
            text = " ".join(rng.choice(words, size=int(rng.integers(20, 600))))
            f.write(json.dumps({"text": text}) + "\n")
            size += len(text) + 1
    for seq in args.seqs.split(","):
        build(BuildConfig(out=str(work / f"rows-{seq}"), dataset="jsonl",
                          inputs=(str(work / "corpus.jsonl"),), tokenizer=str(ranks),
                          seq=int(seq), val_fraction=0.02, format="memmap",
                          tokenizer_engine="reference"), show_progress=False)
        print(f"  built {work / f'rows-{seq}'}", flush=True)


# -- zoo ------------------------------------------------------------------------------------------

ZOO = ("neox-tiny", "moe-tiny", "mamba-tiny", "hybrid-tiny", "resonance-tiny")


def rel(a, b) -> float:
    """max |a - b| / max |b|: a difference relative to the reference's scale."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


def zoo(args) -> None:
    """Every family's eager checks first, then the compiled ones (the slow part: a step cut
    short by its time limit has measured every family eager)."""
    import torch

    from longpack import archs

    dev = device(args)
    T = 64 if args.smoke else 256
    # the tiny presets' vocabulary; seeded: where bf16 flips a token's expert choice, an MoE's
    # logits differ from fp32's far more than elsewhere, and some draws hold such a token (the
    # CPU smoke test passed or failed with the draw)
    x = torch.randint(0, 512, (2, T), generator=torch.Generator().manual_seed(0)).to(dev)
    y = torch.roll(x, -1, 1)
    starts = torch.tensor([[0, T // 3, T // 2, -1], [0, -1, -1, -1]], device=dev)
    docs = [x[0, :T // 3], x[0, T // 3:T // 2], x[0, T // 2:]]
    bf16 = torch.autocast(dev.type, dtype=torch.bfloat16)
    for name in ZOO:
        torch.manual_seed(0)
        model = archs.build(name).to(dev).eval()
        with torch.no_grad():
            ref = model(x, doc_starts=starts)
            with bf16:
                low = model(x, doc_starts=starts)
        emit(f"zoo.{name}.bf16_logits_rel_diff", rel(low, ref), "",
             f"bf16 autocast against fp32, 2 rows of {T} on {dev.type}")
        model.train()
        with bf16:
            loss = model.loss(x, y, starts)["loss"]
        loss.backward()
        finite = bool(torch.isfinite(loss.detach())) and all(
            p.grad is None or bool(torch.isfinite(p.grad).all()) for p in model.parameters())
        emit(f"zoo.{name}.grads_finite", finite, "", f"bf16 loss {float(loss.detach()):.4f}")
        model.eval()
        with torch.no_grad(), bf16:
            packed = model(x[:1], doc_starts=starts[:1])[0]
            alone = torch.cat([model(d[None])[0] for d in docs])
        emit(f"zoo.{name}.packed_vs_alone", rel(packed, alone), "", "bf16 logits, 3 documents")
    # Each compiled case in a process of its own: a CUDA fault (an illegal memory access, seen
    # on the first GPU) ends the process's CUDA context, and the next case must still run.
    diagnosed = False
    for name in filter(None, args.compile_families.split(",")):
        if not compiled_case(args, name, "", T, None, False) and dev.type == "cuda" \
                and not diagnosed:
            # what the failure depends on, for the first family that fails (each case is a
            # compile: ~20 s); the other families still get their own compiled check
            for label, seq, width, train in DIAGNOSIS:
                compiled_case(args, name, label, seq, width, train)
            diagnosed = True
    ssd(args)


def ssd(args) -> None:
    import torch

    from longpack import archs
    from longpack.archs import mamba

    dev = device(args)
    which = mamba.scan_name(dev)
    emit("ssd.kernel", which == "fla", "", f"the scan on {dev.type}: {which}")
    if which != "fla":
        return
    g = torch.Generator(dev).manual_seed(0)
    for T in (256, 2000) if args.smoke else (256, 4096):
        b, G, R, P, N = 2, 1, 8, 64, 128  # mamba-370m's head width and state, 8 heads
        inputs = [torch.randn(b, T, G, R, P, device=dev, generator=g),
                  torch.rand(b, T, G, R, device=dev, generator=g) * 0.1,
                  -torch.rand(G, R, device=dev, generator=g) * 4 - 1,
                  torch.randn(b, T, G, N, device=dev, generator=g) / N ** 0.5,
                  torch.randn(b, T, G, N, device=dev, generator=g) / N ** 0.5]
        seg = torch.zeros(b, T, dtype=torch.long, device=dev)
        seg[0, T // 3:] = 1
        seg[0, T // 2:] = 2  # row 0: three documents, row 1: one
        grad = torch.randn(b, T, G, R, P, device=dev, generator=g)
        outs = []
        for fn in (lambda *a: mamba.ssd_chunked(*a)[0], mamba.fla_scan):
            leaves = [t.clone().requires_grad_() for t in inputs]
            y = fn(*leaves, seg)
            y.backward(grad)
            outs.append((y.detach(), [t.grad for t in leaves]))
        (ref, ref_g), (got, got_g) = outs
        what = f"2 rows of {T}, 4 documents, fp32, against ssd_chunked"
        emit(f"ssd.{T}.out_rel_err", rel(got, ref), "", what)
        emit(f"ssd.{T}.grad_rel_err", max(rel(a, r) for a, r in zip(got_g, ref_g)), "",
             what + ": x, dt, A, B, C")
    # a whole model, the kernel against the reference (the package hidden), documents included
    x = torch.randint(0, 512, (2, 300), device=dev)
    starts = torch.tensor([[0, 100, 170], [0, -1, -1]], device=dev)
    runs = []
    for hidden in (False, True):
        torch.manual_seed(0)
        model = archs.build("mamba-tiny").to(dev)
        saved = mamba._FLA[:]
        if hidden:
            mamba._FLA[:] = [None]
        try:
            loss = model.loss(x[:, :-1], x[:, 1:], starts)["loss"]
            loss.backward()
        finally:
            mamba._FLA[:] = saved
        runs.append((loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    emit("ssd.model.loss_rel_err", rel(runs[0][0], runs[1][0]), "", "mamba-tiny, fp32")
    emit("ssd.model.grad_rel_err", rel(runs[0][1], runs[1][1]), "", "mamba-tiny, fp32")


# The cases that tell what a failing compiled check depends on (docs/BENCHMARKS.md, 2026-11-26:
# rows of 256, heads of 16, inference crashed; rows of 2,048 in training ran).
DIAGNOSIS = (("rows_2048", 2048, None, False), ("heads_of_64", 256, 256, False),
             ("training", 256, None, True))


def compiled_case(args, name: str, label: str, seq: int, width, train: bool) -> bool:
    """Run `compiled` for one case in a child process; its figure, or the error's line."""
    figure = f"zoo.{name}.compiled_vs_eager" + (f".{label}" if label else "")
    cmd = [sys.executable, __file__, "compiled", "--family", name, "--seq", str(seq),
           "--name", figure] + (["--d-model", str(width)] if width else []) + \
          (["--train"] if train else []) + (["--figures", FIGURES] if FIGURES else []) + \
          (["--device", args.device] if args.device else [])
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")  # the failing kernel named, not a later one
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    sys.stdout.write(p.stdout)
    if p.returncode:
        lines = [ln for ln in p.stderr.splitlines() if "Error" in ln] or p.stderr.splitlines()
        kernel = [ln.strip() for ln in p.stderr.splitlines() if ln.strip().startswith("triton_")]
        emit(figure, None, "", f"failed: {(lines or ['exit ' + str(p.returncode)])[-1][:200]}"
             + (f" in {kernel[-1].split('.run(')[0]}" if kernel else ""))
        sys.stderr.write(p.stderr[-3000:])
    return p.returncode == 0


def compiled(args) -> None:
    """One compiled-vs-eager case: 2 rows of --seq under bf16 autocast, documents as zoo's;
    logits (or, --train, the loss's gradients) of torch.compile against eager."""
    import torch

    from longpack import archs

    dev = device(args)
    T = args.seq
    torch.manual_seed(0)
    model = archs.build(args.family, max_seq=T, **({"d_model": args.d_model}
                                                   if args.d_model else {})).to(dev)
    x = torch.randint(0, 512, (2, T), device=dev)
    starts = torch.tensor([[0, T // 3, T // 2, -1], [0, -1, -1, -1]], device=dev)
    backend = "inductor" if dev.type == "cuda" else "aot_eager"  # no C++ build on the CPU
    fast = torch.compile(model, backend=backend)
    bf16 = torch.autocast(dev.type, dtype=torch.bfloat16)
    heads = getattr(model.cfg, "n_heads", 0)
    what = (f"bf16, 2 rows of {T}" + (f", heads of {model.cfg.d_model // heads}" if heads else "")
            + ", "
            + f"{'training: gradients' if args.train else 'logits'}, {backend}")
    if args.train:
        grads = []
        for m in (model, fast):
            model.zero_grad(set_to_none=True)
            with bf16:
                m.loss(x, torch.roll(x, -1, 1), starts)["loss"].backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()
                                    if p.grad is not None]))
        emit(args.name, rel(grads[1], grads[0]), "", what)
    else:
        model.eval()
        with torch.no_grad(), bf16:
            eager, out = model(x, doc_starts=starts), fast(x, doc_starts=starts)
        emit(args.name, rel(out, eager), "", what)


# -- flex -----------------------------------------------------------------------------------------

def per_document_sdpa(q, k, v, doc_starts):
    """longpack.archs.layers.attention's CPU path (causal SDPA per document), on any device."""
    import torch.nn.functional as F

    from longpack.archs.documents import Documents

    out = q.new_empty(q.shape)
    for b, spans in enumerate(Documents(doc_starts, q.shape[2]).spans()):
        for lo, hi in spans:
            out[b:b + 1, :, lo:hi] = F.scaled_dot_product_attention(
                q[b:b + 1, :, lo:hi], k[b:b + 1, :, lo:hi], v[b:b + 1, :, lo:hi], is_causal=True)
    return out


def timed(fn, inputs, rest, grad_out, backward: bool, repeat: int):
    """fn(*inputs, *rest): (output, the inputs' gradients, best seconds of forward (+ backward))
    after one warm-up."""
    import torch

    best, out, grads = math.inf, None, None
    for i in range(repeat + 1):
        for t in inputs:
            t.grad = None
        if inputs[0].is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(*inputs, *rest)
        if backward:
            out.backward(grad_out)
        if inputs[0].is_cuda:
            torch.cuda.synchronize()
        if i:
            best = min(best, time.perf_counter() - t0)
    if backward:
        grads = torch.cat([t.grad.flatten() for t in inputs])
    return out.detach(), grads, best


def flex(args) -> None:
    import warnings

    import numpy as np
    import torch

    from longpack.archs.layers import _flex_document_attention

    dev = device(args)
    cuda = dev.type == "cuda"
    heads, dim = (2, 16) if args.smoke else (16, 128)  # neox-1.2b's heads
    dtype = torch.bfloat16 if cuda else torch.float32
    # FlexAttention has no CPU backward: the CPU smoke compares the forward only
    flex_fn = (torch.compile(_flex_document_attention, dynamic=False) if cuda
               else _flex_document_attention)
    warnings.filterwarnings("ignore")
    for role, seq in zip(("short", "long"), map(int, args.seqs.split(","))):
        rng = np.random.default_rng(seq)
        lengths = np.maximum(16, rng.exponential(args.doc_len, size=seq // 8).astype(int))
        starts = np.concatenate([[0], np.cumsum(lengths)])
        starts = starts[starts < seq]
        doc_starts = torch.tensor(starts, device=dev)[None]
        torch.manual_seed(0)
        qkv = [torch.randn(1, heads, seq, dim, device=dev, dtype=dtype, requires_grad=cuda)
               for _ in range(3)]
        grad_out = torch.randn(1, heads, seq, dim, device=dev, dtype=dtype)
        what = (f"seq {seq}, {len(starts)} documents (mean {seq / len(starts):.0f}), {heads} "
                f"heads of {dim}, {dtype}".replace("torch.", ""))
        ref, ref_grads, t_sdpa = timed(per_document_sdpa, qkv, (doc_starts,), grad_out, cuda,
                                       args.repeat)
        emit(f"flex.{role}.sdpa_ms", 1e3 * t_sdpa, "ms", "per-document SDPA, " +
             ("forward + backward" if cuda else "forward"))
        try:
            out, grads, t_flex = timed(flex_fn, qkv, (doc_starts, False), grad_out, cuda,
                                       args.repeat)
        except torch.OutOfMemoryError as e:
            emit(f"flex.{role}.out_rel_err", None, "", f"out of memory: {str(e)[:160]}")
            continue
        emit(f"flex.{role}.out_rel_err", rel(out, ref), "", what)
        if cuda:
            emit(f"flex.{role}.grad_rel_err", rel(grads, ref_grads), "", what)
        emit(f"flex.{role}.flex_ms", 1e3 * t_flex, "ms",
             "FlexAttention, " + ("compiled, forward + backward" if cuda else "eager, forward"))
        emit(f"flex.{role}.speedup", t_sdpa / t_flex, "x", "per-document SDPA time / Flex time")
        del ref, ref_grads, out, grads
        if cuda:  # what a run without --compile calls: FlexAttention's unfused implementation
            try:
                torch.cuda.empty_cache()
                t_eager = timed(_flex_document_attention, qkv, (doc_starts, False), grad_out,
                                True, 1)[2]
                emit(f"flex.{role}.eager_flex_ms", 1e3 * t_eager, "ms",
                     "FlexAttention uncompiled (a run without --compile), forward + backward")
            except torch.OutOfMemoryError as e:
                emit(f"flex.{role}.eager_flex_ms", None, "",
                     f"uncompiled: out of memory ({str(e).splitlines()[0][:120]})")
            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("check", choices=("env", "corpus", "zoo", "compiled", "flex", "ssd"))
    ap.add_argument("--figures", default=os.environ.get("GPU_SUITE_FIGURES"))
    ap.add_argument("--smoke", action="store_true", help="toy sizes (the CPU smoke run)")
    ap.add_argument("--device", default=None, help="cuda or cpu [cuda when there is one]")
    ap.add_argument("--out", default="env.json", help="env: where the JSON goes")
    ap.add_argument("--commit", default=None, help="env: the checkout measured")
    ap.add_argument("--work", default="gpu-suite-work", help="corpus: where it is built")
    ap.add_argument("--tokens", type=int, default=2_000_000, help="corpus: its size")
    ap.add_argument("--seqs", default="2048", help="corpus: row lengths; flex: short,long")
    ap.add_argument("--doc-len", type=int, default=2048, help="flex: mean document length")
    ap.add_argument("--repeat", type=int, default=3, help="flex: timed calls")
    ap.add_argument("--compile-families", default="neox-tiny,moe-tiny", help="zoo")
    ap.add_argument("--family", help="compiled: the tiny preset")
    ap.add_argument("--seq", type=int, default=256, help="compiled: row length")
    ap.add_argument("--d-model", type=int, default=None, help="compiled: another width")
    ap.add_argument("--train", action="store_true", help="compiled: compare gradients")
    ap.add_argument("--name", help="compiled: the figure's name")
    args = ap.parse_args()
    global FIGURES
    FIGURES = args.figures
    globals()[args.check](args)


if __name__ == "__main__":
    main()
