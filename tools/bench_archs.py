#!/usr/bin/env python
"""Forward + backward throughput of the model zoo, on CPU always and on a GPU when there is one.

CPU (what this 2-core machine can show):
  1. equal width and depth (d 256, 4 layers, vocab 50257) for gpt-neox, moe and resonance at
     seq 1024 / 2048 / 4096, batch 1, fp32: tokens/s of one training step (forward, chunked
     loss, backward), best of --repeat;
  2. resonance scaling: d 64, 2 layers, seq 4k -> 64k: seconds per step divided by L log2 L
     should stay flat if the time grows as L log L (printed as a ratio to the 4k figure);
  2b. Mamba against gpt-neox at equal width and depth (d 128, 2 layers, vocab 512, batch 1,
     fp32) at 2k -> 32k (--scan-seqs): tokens/s of a training step, rounds alternating, and the
     first length where Mamba's linear scan passes attention's quadratic cost (--only-scan);
  2c. Mamba's lean scan (archs/mamba.py LeanMix: backward recomputes the scan's internals)
     against the plain autograd path (MambaMixer.lean = False, the layer before issue 43) on
     --lean-models (a preset, or "scan": 2b's d 128 shape) at --lean-seq tokens, batch 1, fp32,
     document-masked rows: seconds per step, rounds alternating, and their ratio (--only-lean);
  3. against a nanoGPT-shaped GPT written below (learned positions, pre-LN, fused qkv, GELU MLP,
     tied head; the shape of nanoGPT's model.py, written here): 6 layers, d 384, 6 heads, FFN 1536,
     vocab 50257, batch 4 x 1024, a whole AdamW step, fp32 and bf16 autocast; each zoo family at
     the same width and depth (MoE: 4 experts, top 2, expert width 512 = the dense MLP's FLOPs),
     rounds alternating; target every family >= 1.0x the baseline's tokens/s.
GPU (CUDA available; bf16 autocast):
  3. tokens/s and MFU, nominal (model.flops_per_token) and "useful" (attention FLOPs counted
     only within documents, from the mean document length --doc-len) against the device's peak
     (--peak-tflops, default 989 = H100 SXM dense bf16), torch.compile (the first step's time,
     compilation included, is printed apart): neox-350m at seq 2048; neox-1.2b on
     document-masked 32k rows and on whole 32k rows;
  4. resonance and Mamba vs gpt-neox at equal width and depth (d 1024, 8 layers, vocab 50257,
     batch 1, eager: one compilation per length would cost more than the scan) from 4k to 64k
     (--gpu-scan-seqs): tokens/s, and each one's ratio to gpt-neox. A case that runs out of
     memory is printed (and recorded) as such and the next one runs.
Targets (GPU, issues 4 and 34): neox >= 40% MFU at 2048 for >= 350M parameters; neox-1.2b on
doc-masked 32k rows >= 35k tokens/s; resonance faster than gpt-neox from 16k. The script prints
its figures and exits 0: a measuring tool, not a test. --gpu-only runs the GPU sections alone;
--json FILE appends one JSON object per GPU figure as it is measured (tools/gpu_suite.sh reads
them); --device cpu --toy runs the same GPU cases at toy sizes on the CPU (the suite's
--cpu-smoke, so that the GPU code cannot rot unrun).

    .venv/bin/python tools/bench_archs.py [--repeat 3] [--rounds 3] [--cpu-only] [--only-nano]
                                          [--families gpt-neox,moe,resonance] [--dtypes fp32,bf16]
                                          [--only-scan] [--scan-seqs 2048,4096,8192,16384,32768]
                                          [--only-lean] [--lean-models mamba-130m,scan]
                                          [--lean-seq 1024]
                                          [--peak-tflops 989] [--gpu-only] [--json FILE]
                                          [--gpu-scan-seqs 4096,8192,16384,32768,65536]
                                          [--device cuda|cpu] [--toy] [--gpu-cases mfu_2k,docs_32k]
"""

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from longpack import archs


def step_time(model, batch: int, seq: int, device, doc_len: int | None, repeat: int,
              autocast: bool, warmup: list | None = None,
              doc_starts: torch.Tensor | None = None) -> float:
    """Best wall seconds of one training step (forward + loss + backward); the warm-up step's
    seconds (compilation included) are appended to `warmup` when it is given. The rows'
    documents: every `doc_len` tokens, or `doc_starts` (B, K) as given."""
    vocab = model.cfg.vocab_size
    x = torch.randint(0, vocab, (batch, seq), device=device)
    y = torch.randint(0, vocab, (batch, seq), device=device)
    starts = None if doc_starts is None else doc_starts.to(device)
    if doc_len:
        s = torch.arange(0, seq, doc_len, device=device)
        starts = s.expand(batch, len(s)).contiguous()
    best = math.inf
    for i in range(repeat + 1):  # the first step warms up (compilation, allocator)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model.loss(x, y, starts)["loss"]
        loss.backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            best = min(best, time.perf_counter() - t)
        elif warmup is not None:
            warmup.append(time.perf_counter() - t)
    return best


def cpu_section(repeat: int):
    torch.set_num_threads(torch.get_num_threads())
    cpu = torch.device("cpu")
    print(f"== CPU ({torch.get_num_threads()} threads), fp32, batch 1, d 256, 4 layers, "
          f"vocab 50257: tokens/s of a training step (best of {repeat})")
    shapes = {"gpt-neox": dict(d_model=256, n_layers=4, n_heads=4, d_ff=1024),
              "moe": dict(d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, n_experts=4,
                          top_k=2, d_expert=512),
              "resonance": dict(d_model=256, n_layers=4, num_frequencies=64),
              "mamba": dict(d_model=256, n_layers=4)}
    print(f"  {'model':<12}{'params':>12}" + "".join(f"{'seq ' + str(s):>12}"
                                                     for s in (1024, 2048, 4096)))
    for family, shape in shapes.items():
        torch.manual_seed(0)
        model = archs.build(family, **shape)
        rates = [seq / step_time(model, 1, seq, cpu, None, repeat, False)
                 for seq in (1024, 2048, 4096)]
        print(f"  {family:<12}{model.num_params():>12,}" + "".join(f"{r:>12,.0f}"
                                                                   for r in rates))
    print("\n== CPU resonance scaling, d 64, 2 layers, vocab 256, batch 1: time / (L log2 L), "
          "relative to 4k (flat = O(L log L))")
    model = archs.build("resonance", d_model=64, n_layers=2, num_frequencies=64, vocab_size=256)
    base = None
    for seq in (4096, 8192, 16384, 32768, 65536):
        t = step_time(model, 1, seq, cpu, None, max(1, repeat - 1), False)
        per = t / (seq * math.log2(seq))
        base = base or per
        print(f"  seq {seq:>6}: {t:7.3f} s/step, {seq / t:>9,.0f} tokens/s, "
              f"time/(L log L) x{per / base:.2f}")


SCAN_SHAPES = {"gpt-neox": dict(d_model=128, n_layers=2, n_heads=2, d_ff=512, vocab_size=512),
               "mamba": dict(d_model=128, n_layers=2, vocab_size=512)}


def scan_section(repeat: int, rounds: int, seqs: list[int]):
    """Mamba vs gpt-neox at equal width and depth as the row grows: each length's steps
    alternate between the two models for `rounds` rounds (best step each); printed as
    measured, then the first length where Mamba is the faster."""
    cpu = torch.device("cpu")
    print(f"\n== CPU ({torch.get_num_threads()} threads), Mamba vs gpt-neox, d 128, 2 layers, "
          f"vocab 512, batch 1, fp32: tokens/s of a training step (best of {repeat} steps x "
          f"{rounds} alternating rounds)", flush=True)
    models = {}
    for family, shape in SCAN_SHAPES.items():
        torch.manual_seed(0)
        models[family] = archs.build(family, **{**shape, "max_seq": max(seqs)})
        print(f"  {family:<10}{models[family].num_params():>10,} params", flush=True)
    crossed = None
    for seq in seqs:
        best = dict.fromkeys(models, math.inf)
        for _ in range(rounds):
            for family, model in models.items():
                best[family] = min(best[family], step_time(model, 1, seq, cpu, None, repeat,
                                                           False))
        rates = {f: seq / t for f, t in best.items()}
        ratio = rates["mamba"] / rates["gpt-neox"]
        print(f"  seq {seq:>6}: gpt-neox {rates['gpt-neox']:>9,.0f} tokens/s, mamba "
              f"{rates['mamba']:>9,.0f} tokens/s, mamba/neox {ratio:5.2f}x", flush=True)
        if crossed is None and ratio >= 1:
            crossed = seq
    print("  crossing: " + (f"mamba is faster from seq {crossed}" if crossed else
                            f"mamba is not faster up to seq {seqs[-1]}"))


def lean_section(repeat: int, rounds: int, names: list[str], seq: int):
    """The lean scan against the plain autograd path, the same weights and rows; each round
    times both (best step each). ratio = plain's seconds / lean's (>= 1: lean no slower)."""
    from longpack.archs.mamba import MambaMixer

    cpu = torch.device("cpu")
    print(f"\n== CPU ({torch.get_num_threads()} threads), Mamba's lean scan vs the plain autograd "
          f"path, batch 1 x {seq}, fp32, documents of {seq // 4}: seconds per step (best of "
          f"{repeat} steps x {rounds} alternating rounds)", flush=True)
    for name in names:
        torch.manual_seed(0)
        model = archs.build("mamba", **{**SCAN_SHAPES["mamba"], "max_seq": seq}) \
            if name == "scan" else archs.build(name, max_seq=max(seq, 2048))
        best = {True: math.inf, False: math.inf}
        try:
            for _ in range(rounds):
                for lean in (False, True):
                    MambaMixer.lean = lean
                    best[lean] = min(best[lean], step_time(model, 1, seq, cpu, seq // 4, repeat,
                                                           False))
        finally:
            MambaMixer.lean = True
        print(f"  {name:<12}{model.num_params():>13,} params: plain {best[False]:7.3f} s, lean "
              f"{best[True]:7.3f} s, plain/lean {best[False] / best[True]:5.2f}x", flush=True)


class NanoBlock(nn.Module):
    def __init__(self, d: int, heads: int, ff: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(B, T, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, T, d/heads)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class NanoGPT(nn.Module):
    """The baseline: what a 60-line GPT does, with full logits and one loss call."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, ff: int, seq: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(NanoBlock(d, heads, ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as in nanoGPT

    def loss(self, x, y, doc_starts=None):
        h = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.ln_f(h))
        return {"loss": F.cross_entropy(logits.float().flatten(0, 1), y.flatten())}


NANO = dict(d=384, layers=6, heads=6, ff=1536, vocab=50257, batch=4, seq=1024)


def zoo_at_nano_shape(family: str) -> nn.Module:
    n = NANO
    shape = {"gpt-neox": dict(n_heads=n["heads"], d_ff=n["ff"]),
             # Two SwiGLU experts of width 2*ff/6 (three matrices each) per token: the dense
             # MLP's 2*d*ff multiply-adds (ff // 4 gave the MoE 3/4 of the baseline's MLP work).
             "moe": dict(n_heads=n["heads"], n_kv_heads=n["heads"], n_experts=4, top_k=2,
                         d_expert=2 * n["ff"] // (3 * 2)),
             "resonance": dict(d_ff=n["ff"])}[family]
    return archs.build(family, vocab_size=n["vocab"], d_model=n["d"], n_layers=n["layers"],
                       **shape)


def train_step_seconds(model: nn.Module, opt: torch.optim.Optimizer, batch, bf16: bool,
                       steps: int) -> float:
    """Best wall seconds of `steps` whole AdamW training steps (forward, loss, backward, step)."""
    x, y = batch
    best = math.inf
    for _ in range(steps):
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model.loss(x, y)["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        best = min(best, time.perf_counter() - t)
    return best


BASELINE = "nanoGPT baseline"


def nano_section(repeat: int, rounds: int, families=None, dtypes=("fp32", "bf16")):
    """Every figure is printed as it is measured (a bf16 step takes minutes on a CPU without
    bf16 instructions). One fp32 warm-up step per model first (allocator, AdamW state); then per
    dtype `rounds` rounds, each timing every model in turn for `repeat` steps (alternating, so
    load from other processes falls on all of them); each model's best step counts."""
    n = NANO
    tokens = n["batch"] * n["seq"]
    families = families or FAMILIES_AT_NANO
    print(f"\n== CPU, nanoGPT-shaped baseline vs the zoo at equal width/depth: {n['layers']} "
          f"layers, d {n['d']}, {n['heads']} heads, FFN {n['ff']}, vocab {n['vocab']}, batch "
          f"{n['batch']} x {n['seq']}, whole AdamW step; best of {repeat} steps per round, "
          f"{rounds} alternating rounds", flush=True)
    torch.manual_seed(0)
    models = {BASELINE: NanoGPT(n["vocab"], n["d"], n["layers"], n["heads"], n["ff"], n["seq"])}
    models.update({family: zoo_at_nano_shape(family) for family in families})
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    batch = (torch.randint(0, n["vocab"], (n["batch"], n["seq"])),
             torch.randint(0, n["vocab"], (n["batch"], n["seq"])))
    for name, model in models.items():
        seconds = train_step_seconds(model, opts[name], batch, False, 1)
        print(f"  warm-up {name:<18}{seconds:8.2f} s", flush=True)
    results = {}
    for dtype in dtypes:
        bf16 = dtype == "bf16"
        best = {name: math.inf for name in models}
        for r in range(rounds):
            for name, model in models.items():
                seconds = train_step_seconds(model, opts[name], batch, bf16, repeat)
                best[name] = min(best[name], seconds)
                print(f"  {dtype} round {r + 1}/{rounds} {name:<18}{seconds:8.2f} s/step "
                      f"{tokens / seconds:>8,.0f} tokens/s", flush=True)
        results[dtype] = best
    print("  summary (best step of each model; target: every family >= 1.00x the baseline)")
    for dtype, best in results.items():
        base = tokens / best[BASELINE]
        print(f"  {'bf16 autocast' if dtype == 'bf16' else 'fp32'}")
        for name, seconds in best.items():
            rate = tokens / seconds
            verdict = "" if name == BASELINE else ("  PASS" if rate >= base else "  FAIL")
            print(f"    {name:<18}{rate:>10,.0f} tokens/s  {rate / base:5.2f}x{verdict}",
                  flush=True)


FAMILIES_AT_NANO = ("gpt-neox", "moe", "resonance")


def useful_flops(model, seq: int, doc_len: int | None) -> float:
    """FLOPs/token counting attention only within documents of mean length doc_len."""
    if not doc_len or not hasattr(model.cfg, "n_heads"):
        return model.flops_per_token(seq)
    c = model.cfg
    return model.flops_per_token(seq) - 12 * c.n_layers * c.d_model * (seq - doc_len)


GPU_SCAN_SHAPE = dict(d_model=1024, n_layers=8, vocab_size=50257)  # equal width and depth
GPU_SCAN_EXTRA = {"gpt-neox": dict(n_heads=16, d_ff=4096), "resonance": {}, "mamba": {}}
# (role, model, batch, seq, document length); a role names the figure in the suite's report
GPU_CASES = [("mfu_2k", "neox-350m", 8, 2048, None), ("docs_32k", "neox-1.2b", 1, 32768, 2048),
             ("whole_32k", "neox-1.2b", 1, 32768, None)]
TOY_CASES = [("mfu_2k", "neox-tiny", 2, 128, None), ("docs_32k", "neox-tiny", 1, 512, 128),
             ("whole_32k", "neox-tiny", 1, 512, None)]
TOY_SCAN_SHAPE = dict(d_model=64, n_layers=2, vocab_size=512)
TOY_SCAN_EXTRA = {"gpt-neox": dict(n_heads=4, d_ff=256), "resonance": {}, "mamba": {}}


class CompiledLoss:
    """The model with its loss compiled as the trainer compiles it (longpack.training.step.LossOf: the
    loss as a module's forward). torch.compile(model) alone would compile forward only, and
    model.loss, reached through it, would run eager."""

    def __init__(self, model):
        from longpack.training.step import LossOf

        self.cfg, self.zero_grad = model.cfg, model.zero_grad
        self.loss = torch.compile(LossOf(model))


def record(json_path, **fields) -> None:
    """One figure, appended to --json as a line as soon as it is measured (a run cut short by
    a time limit keeps what it measured)."""
    if json_path:
        with open(json_path, "a") as f:
            f.write(json.dumps(fields) + "\n")


def gpu_section(repeat: int, peak_tflops: float, doc_len: int, device: str = "cuda",
                toy: bool = False, scan_seqs=(4096, 8192, 16384, 32768, 65536),
                json_path=None, roles=None):
    """The GPU cases (see the docstring), on `device`; `toy`: the same cases at toy sizes and
    uncompiled (the CPU smoke run)."""
    dev = torch.device(device)
    compiled = dev.type == "cuda" and not toy
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    where = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU"
    print(f"\n== GPU cases on {where}{' (toy sizes)' if toy else ''}, bf16 autocast"
          f"{', torch.compile' if compiled else ', eager'}; peak {peak_tflops} TFLOP/s", flush=True)
    cases = TOY_CASES if toy else [(role, name, batch, seq, docs and doc_len)
                                   for role, name, batch, seq, docs in GPU_CASES]
    for role, name, batch, seq, docs in cases:
        if roles is not None and role not in roles:
            continue
        label = f"{name} seq {seq}" + (f" docs of {docs}" if docs else "")
        try:
            torch.manual_seed(0)
            raw = archs.build(name, device=dev, max_seq=seq)
            model = CompiledLoss(raw) if compiled else raw
            warm = []
            t = step_time(model, batch, seq, dev, docs, repeat, True, warm)
        except torch.OutOfMemoryError as e:
            print(f"  {label:<34} out of memory", flush=True)
            record(json_path, case="mfu", role=role, model=name, batch=batch, seq=seq,
                   doc_len=docs, error=f"out of memory: {str(e).splitlines()[0][:200]}")
            continue
        finally:
            model = raw = None
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        tps = batch * seq / t
        built = archs.build(name, device="meta", max_seq=seq)
        nominal = tps * built.flops_per_token(seq) / (peak_tflops * 1e12)
        useful = tps * useful_flops(built, seq, docs) / (peak_tflops * 1e12)
        print(f"  {label:<34}{built.num_params():>15,} params {tps:>10,.0f} tokens/s  MFU "
              f"{100 * nominal:5.1f}% nominal, {100 * useful:5.1f}% useful; first step "
              f"{warm[0]:.1f} s", flush=True)
        record(json_path, case="mfu", role=role, model=name, batch=batch, seq=seq, doc_len=docs,
               params=built.num_params(), tokens_per_s=tps, mfu_nominal=nominal,
               mfu_useful=useful, first_step_seconds=warm[0], compiled=compiled)
    gpu_scan(dev, repeat, scan_seqs, toy, json_path)


def gpu_scan(dev, repeat: int, seqs, toy: bool, json_path) -> None:
    """Resonance and Mamba against gpt-neox at equal width and depth, eager, batch 1."""
    shape, extra = (TOY_SCAN_SHAPE, TOY_SCAN_EXTRA) if toy else (GPU_SCAN_SHAPE, GPU_SCAN_EXTRA)
    from longpack.archs.mamba import scan_name

    print(f"  scan, eager, batch 1, {shape}: tokens/s (Mamba's scan: {scan_name(dev)})",
          flush=True)
    for seq in seqs:
        rates = {}
        for family in ("gpt-neox", "resonance", "mamba"):
            try:
                torch.manual_seed(0)
                model = archs.build(family, device=dev, max_seq=max(seqs), **shape,
                                    **extra[family])
                rates[family] = seq / step_time(model, 1, seq, dev, None, repeat, True)
                record(json_path, case="scan", family=family, seq=seq,
                       tokens_per_s=rates[family], **({"scan": scan_name(dev)}
                                                      if family == "mamba" else {}))
            except torch.OutOfMemoryError as e:
                record(json_path, case="scan", family=family, seq=seq,
                       error=f"out of memory: {str(e).splitlines()[0][:200]}")
            finally:
                model = None
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        line = ", ".join(f"{f} {rates[f]:>9,.0f}" if f in rates else f"{f} out of memory"
                         for f in ("gpt-neox", "resonance", "mamba"))
        ratios = "".join(f", {f}/neox {rates[f] / rates['gpt-neox']:.2f}x"
                         for f in ("resonance", "mamba") if f in rates and "gpt-neox" in rates)
        print(f"    seq {seq:>6}: {line}{ratios}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu-only", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds, nanoGPT section")
    ap.add_argument("--only-nano", action="store_true", help="only the nanoGPT comparison")
    ap.add_argument("--only-scan", action="store_true", help="only Mamba vs gpt-neox by length")
    ap.add_argument("--scan-seqs", default="2048,4096,8192,16384,32768",
                    help="row lengths of the Mamba vs gpt-neox comparison")
    ap.add_argument("--only-lean", action="store_true",
                    help="only Mamba's lean scan vs the plain autograd path")
    ap.add_argument("--lean-models", default="mamba-130m,scan",
                    help="Mamba presets (or 'scan', 2b's shape) of the lean vs plain comparison")
    ap.add_argument("--lean-seq", type=int, default=1024,
                    help="row length of the lean vs plain comparison")
    ap.add_argument("--families", default=",".join(FAMILIES_AT_NANO),
                    help="comma-separated zoo families of the nanoGPT comparison")
    ap.add_argument("--dtypes", default="fp32,bf16",
                    help="nanoGPT comparison: fp32, bf16 (autocast) or both, comma-separated")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--doc-len", type=int, default=2048,
                    help="document length of the doc-masked GPU rows")
    ap.add_argument("--gpu-only", action="store_true", help="only the GPU cases and scan")
    ap.add_argument("--gpu-scan-seqs", default="4096,8192,16384,32768,65536",
                    help="row lengths of the GPU scan (resonance and Mamba vs gpt-neox)")
    ap.add_argument("--json", default=None, metavar="FILE",
                    help="append each GPU figure to FILE as a JSON line")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="where the GPU cases run (cpu: with --toy, the suite's smoke run)")
    ap.add_argument("--toy", action="store_true", help="the GPU cases at toy sizes")
    ap.add_argument("--gpu-cases", default=",".join(c[0] for c in GPU_CASES),
                    help="which GPU cases run (the scan always does)")
    args = ap.parse_args()
    families, dtypes = args.families.split(","), args.dtypes.split(",")
    for value, choices, flag in ((families, FAMILIES_AT_NANO, "--families"),
                                 (dtypes, ("fp32", "bf16"), "--dtypes")):
        if not value or not set(value) <= set(choices):
            ap.error(f"{flag}: choose from {', '.join(choices)} (got {','.join(value)})")
    if args.repeat < 1 or args.rounds < 1:
        ap.error("--repeat and --rounds must be at least 1")
    seqs = [int(s) for s in args.scan_seqs.split(",")]
    gpu_seqs = [int(s) for s in args.gpu_scan_seqs.split(",")]
    if args.gpu_only:
        if args.device == "cuda" and not torch.cuda.is_available():
            ap.error("--gpu-only: no CUDA device (--device cpu --toy runs the cases on the CPU)")
        gpu_section(args.repeat, args.peak_tflops, args.doc_len, args.device, args.toy,
                    gpu_seqs, args.json, args.gpu_cases.split(","))
        return
    if args.only_nano:
        nano_section(args.repeat, args.rounds, families, dtypes)
        return
    if args.only_scan:
        scan_section(args.repeat, args.rounds, seqs)
        return
    lean = args.lean_models.split(",")
    if args.only_lean:
        lean_section(args.repeat, args.rounds, lean, args.lean_seq)
        return
    cpu_section(args.repeat)
    scan_section(args.repeat, args.rounds, seqs)
    lean_section(args.repeat, args.rounds, lean, args.lean_seq)
    nano_section(args.repeat, args.rounds, families, dtypes)
    if torch.cuda.is_available() and not args.cpu_only:
        gpu_section(args.repeat, args.peak_tflops, args.doc_len, scan_seqs=gpu_seqs,
                    json_path=args.json, roles=args.gpu_cases.split(","))
    else:
        print("\n(no CUDA device: GPU figures not measured)")


if __name__ == "__main__":
    main()
