"""The memory plan (archs/memory.py, `train --dry-run [--world-size N] [--json]`): the states
are the bytes of the real tensors (one process; two under FSDP and DDP with gloo), the
activation formula is held against the tensors autograd saves and against the CPU's measured
peak for every family, and the dry run prints it per process without launching anything."""

import json
import subprocess
import sys
import time

import pytest
import torch
from click.testing import CliRunner

from longpack import SettingsError, archs
from longpack.archs import activations, memory
from longpack.training.cli import train as train_cli
from longpack.training.config import TrainConfig
from longpack.training.parallel.distributed import Processes

FAMILIES = ["neox-tiny", "moe-tiny", "mamba-tiny", "resonance-tiny", "hybrid-tiny"]
VOCAB = 37  # odd: FSDP pads the embedding's and head's rows


def storage_bytes(tensors) -> int:
    """Bytes of the storages behind `tensors`, each once (a view is its whole storage)."""
    seen = {}
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("name", FAMILIES)
def test_states_are_the_bytes_of_the_tensors_after_a_step(name, optimizer):
    from longpack.training.step import prepare

    torch.manual_seed(0)
    model = archs.build(name, vocab_size=VOCAB)
    cfg = TrainConfig(shards="x", model=name, optimizer=optimizer)
    state = prepare(model, cfg, Processes(0, 1, torch.device("cpu")))
    ids = torch.randint(0, VOCAB, (2, 33))
    model.loss(ids[:, :-1], ids[:, 1:])["loss"].backward()
    grads = storage_bytes(p.grad for p in model.parameters())
    for opt in state.optimizers:
        opt.step()
    held = [v for opt in state.optimizers for s in opt.state.values() for v in s.values()]
    want = memory.states(archs.layout(name, vocab_size=VOCAB), optimizer, memory.Sharding())
    assert want == {"params": storage_bytes([*model.parameters(), *model.buffers()]),
                    "grads": grads, "optimizer": storage_bytes(held), "buffers": 0}


SHARDED = r"""
import json, sys, torch, torch.distributed as dist
from longpack import archs
from longpack.training.config import TrainConfig
from longpack.training.parallel.distributed import Processes
from longpack.training.step import prepare

def storage_bytes(tensors):
    seen = {}
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())

dist.init_process_group("gloo")
rank, out = dist.get_rank(), []
procs = Processes(rank, 2, torch.device("cpu"))
for name, replicas, optimizer in json.loads(sys.argv[1]):
    torch.manual_seed(0)
    model = archs.build(name, vocab_size=37)
    ids = torch.randint(0, 37, (2, 33))
    # the trainer's own preparation: DDP, or --fsdp (training/parallel/fsdp.py) before the optimizers
    cfg = TrainConfig(shards="x", model=name, optimizer=optimizer, fsdp=replicas > 0,
                      fsdp_replicas=max(replicas, 1))
    state = prepare(model, cfg, procs)
    state.loss(ids[:, :-1], ids[:, 1:])["loss"].backward()
    if replicas == 0:  # DDP: its gradient buckets
        info = state.ddp._get_ddp_logging_data()
        out.append({"buckets": sum(int(b) for b in info["bucket_sizes"].split(",")),
                    "bucket_view": bool(info["gradient_as_bucket_view"])})
        continue
    grads = storage_bytes(p.grad for p in model.parameters())
    for opt in state.optimizers:
        opt.step()
    held = [v for opt in state.optimizers for s in opt.state.values() for v in s.values()]
    out.append({"params": storage_bytes([*model.parameters(), *model.buffers()]),
                "grads": grads, "optimizer": storage_bytes(held),
                "numel": sum(p.to_local().numel() for p in model.parameters())})
# one file per process: two processes printing to one pipe can interleave their lines
open(f"{sys.argv[2]}/rank{rank}.json", "w").write(json.dumps(out))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_sharded_states_are_the_bytes_of_each_process_tensors(tmp_path):
    """Two gloo processes prepared as `train --fsdp` prepares them (training/step.py: FSDP2 on
    each block, then the root): every process's shard of a parameter and its gradient are
    padded to ceil(rows / shard) rows, the optimizer's state (AdamW's, Muon's momentum) is the
    unpadded local shard; hybrid sharding with 2 replicas of 1 holds everything; DDP adds
    buckets as large as the gradients."""
    script = tmp_path / "sharded.py"
    script.write_text(SHARDED)
    cases = [["neox-tiny", 1, "adamw"], ["moe-tiny", 1, "adamw"], ["hybrid-tiny", 1, "adamw"],
             ["neox-tiny", 2, "adamw"], ["moe-tiny", 1, "muon"], ["moe-tiny", 0, "adamw"]]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", str(script), json.dumps(cases), str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    results = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    for rank in (0, 1):
        for (name, replicas, optimizer), got in zip(cases, results[rank]):
            lay = archs.layout(name, vocab_size=VOCAB)
            if replicas == 0:
                ddp = memory.states(lay, optimizer, memory.Sharding(2))
                assert got == {"buckets": ddp["buffers"],
                               "bucket_view": memory.DDP_BUCKET_VIEW}, name
                continue
            sharding = memory.Sharding(2, fsdp=True, replicas=replicas)
            local = rank % sharding.shard  # the process's place in its shard group
            want = memory.states(lay, optimizer, sharding, local)
            assert {k: got[k] for k in ("params", "grads", "optimizer")} == {
                k: want[k] for k in ("params", "grads", "optimizer")}, (name, replicas, rank)
            assert got["numel"] == sum(memory.owned_rows(p.shape[0], sharding.shard, local)
                                       * (p.numel // p.shape[0]) for p in lay.params)
    assert results[0][0]["optimizer"] > results[1][0]["optimizer"]  # the last rows are short
    assert results[0][0]["params"] == results[1][0]["params"]  # but padded in storage


# -- activations ---------------------------------------------------------------------------

def batch(vocab: int, rows: int, seq: int, docs: bool):
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (rows, seq + 1))
    starts = torch.tensor([[0, seq // 3, -1]] * rows) if docs else None
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous(), starts


def autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def saved_bytes(model, inputs, precision: str) -> int:
    """Bytes of what autograd saves for backward in a forward and loss (each storage once; the
    parameters themselves are not counted)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast(precision):
        model.loss(*inputs)
    return sum(seen.values())


def formula(name: str, rows: int, seq: int, precision: str, docs: bool, **overrides):
    """The formula for `batch`'s rows (doc_starts 3 wide with documents)."""
    lay = archs.layout(name, **overrides)
    return activations.activations(archs.config(name, **overrides), rows, seq, precision, docs,
                                   cast_numel=memory.block_numel(lay, activations.CAST_ROLES),
                                   doc_width=3 if docs else 0)


CONFIGS = [(name, {}) for name in FAMILIES] + [
    ("moe-tiny", {"n_pred_tokens": 3}), ("moe-tiny", {"mod_capacity": 0.5}),
    ("mamba", dict(vocab_size=64, d_model=48, n_layers=1, head_dim=24, d_state=10, chunk=8,
                   n_groups=2)),  # seq 40: the chunks are padded
    ("resonance", dict(vocab_size=64, d_model=48, n_layers=2, num_frequencies=6, d_ff=72)),
    ("gpt-neox", dict(vocab_size=100, d_model=96, n_layers=2, n_heads=4, d_ff=200,
                      rotary_pct=0.0)),
]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name, overrides", CONFIGS)
@pytest.mark.slow
def test_the_activation_formula_is_what_autograd_saves(name, overrides, precision):
    """Every family, fp32 and bf16 (autocast: its bf16 weight copies too), with and without
    documents, two shapes: within 10% of the saved tensors' bytes (within 2% but where a merge
    of heads is a view the formula counts as a copy: SDPA without documents)."""
    for rows, seq, docs in [(2, 64, True), (3, 40, True), (2, 64, False)]:
        model = archs.build(name, **overrides).train()
        got = saved_bytes(model, batch(model.cfg.vocab_size, rows, seq, docs), precision)
        want = formula(name, rows, seq, precision, docs, **overrides).saved
        assert 0.97 < want / got < 1.10, (rows, seq, docs, want, got)


def measured_peak(model, inputs, precision: str) -> tuple[int, int]:
    """(peak bytes allocated during forward + loss + backward over what was there before,
    the parameters' gradients among them at that moment), from torch.profiler's memory
    timeline."""
    timeline = pytest.importorskip("torch.profiler._memory_profiler")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        with autocast(precision):
            out = model.loss(*inputs)
        out["loss"].backward()
    t = timeline.MemoryProfileTimeline(prof._memory_profile())
    _, sizes = t._coalesce_timeline("cpu")
    totals = [sum(s) for s in sizes]
    at = max(range(len(totals)), key=totals.__getitem__)
    grads = sizes[at][timeline._CATEGORY_TO_INDEX[timeline.Category.GRADIENT] + 1]
    return totals[at] - totals[0], grads


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.slow
def test_the_activation_peak_is_the_measured_one(name, precision, checkpointing):
    """The peak the profiler measures on the CPU (over the micro-batch, made before), less the
    parameters' gradients allocated by then (the plan counts them whole, apart): within 5%
    without activation checkpointing (the end of the forward), 15% with it (a block's
    backward: its recomputed tensors and its widest gradient)."""
    rows, seq = 2, 128
    model = archs.build(name, checkpointing=checkpointing).train()
    peak, grads = measured_peak(model, batch(model.cfg.vocab_size, rows, seq, True), precision)
    act = formula(name, rows, seq, precision, True)
    want = (act.checkpointed if checkpointing else act.peak) - 16 * rows * seq  # the batch
    low, high = (0.85, 1.15) if checkpointing else (0.95, 1.05)
    assert low < want / (peak - grads) < high, (want, peak, grads)


def test_the_loss_keeps_its_log_probabilities_within_the_budget_else_a_chunk():
    from longpack.archs.layers import LOGITS_BUDGET_BYTES

    small, large = activations.Tokens(4, 64), activations.Tokens(8, 32767)
    assert activations.loss(small, 50257) == (4 * 256 * 50257 + 9 * 256, 4 * 256 * 50257)
    assert large.n * 50257 * 4 > LOGITS_BUDGET_BYTES  # chunked: only a chunk's, in backward
    assert activations.loss(large, 50257)[1] == 8 * activations.CE_CHUNK * 50257
    bf16 = activations.Tokens(4, 64, a=2)  # bf16 logits and their fp32 copy beside log-probs
    assert activations.loss(bf16, 50257)[1] == 6 * 256 * 50257


# -- the plan and the refusal ----------------------------------------------------------------

def test_the_plan_shards_states_under_fsdp_and_recomputes_under_checkpointing():
    lay, cfg = archs.layout("moe-5b"), archs.config("moe-5b")

    def total(**kw):
        return memory.memory_plan(lay, cfg, 8, 2048, "bf16", "adamw", **kw)

    ddp, one = total(sharding=memory.Sharding(8)), total()
    assert ddp["params"] == one["params"] == 4 * lay.count + lay.buffer_bytes
    assert ddp["buffers"] == ddp["grads"] and one["buffers"] == 0  # DDP's buckets
    assert ddp["optimizer"] == 8 * lay.count + 4 * len(lay.params)
    fsdp = total(sharding=memory.Sharding(8, fsdp=True))
    assert fsdp["params"] < ddp["params"] / 7.9 and fsdp["optimizer"] < ddp["optimizer"] / 7.9
    hybrid = total(sharding=memory.Sharding(64, fsdp=True, replicas=8))
    assert {k: hybrid[k] for k in ("params", "grads", "optimizer")} == {
        k: fsdp[k] for k in ("params", "grads", "optimizer")}  # shards within 8 either way
    ac = total(sharding=memory.Sharding(8, fsdp=True), checkpointing=True)
    assert ac["activations"] == fsdp["activations_checkpointed"] < fsdp["activations"] / 4
    muon = memory.memory_plan(lay, cfg, 8, 2048, "bf16", "muon")
    assert 0.5 * one["optimizer"] < muon["optimizer"] < 0.6 * one["optimizer"]
    for plan in (one, ddp, fsdp, ac):
        assert plan["total"] == sum(plan[k] for k in ("params", "grads", "optimizer",
                                                      "buffers", "activations"))
        assert plan["floor"] < plan["total"]


def test_a_run_is_refused_by_its_floor_per_process_world_size_aware(monkeypatch):
    from longpack.training.fits import check_memory

    cfg = TrainConfig(shards="x", model="neox-125m", batch_size=1, precision="bf16")
    fsdp = TrainConfig(shards="x", model="neox-125m", batch_size=1, precision="bf16", fsdp=True)
    need = check_memory(cfg, 50257, 2048, torch.device("meta"))["floor"]
    sharded = check_memory(fsdp, 50257, 2048, torch.device("meta"), world=8)["floor"]
    assert sharded < need / 2
    monkeypatch.setattr(archs, "device_memory", lambda device: (need + sharded) // 2)
    with pytest.raises(SettingsError, match=r"training needs at least [\d.]+ GiB \(16 bytes a "
                                            r"parameter for the weights, gradients and AdamW"):
        check_memory(cfg, 50257, 2048, torch.device("cpu"))
    check_memory(fsdp, 50257, 2048, torch.device("cpu"), world=8)  # fits on 8: not refused
    muon = TrainConfig(shards="x", model="neox-125m", batch_size=1, optimizer="muon")
    with pytest.raises(SettingsError, match=r"\(1[23]\.\d bytes a parameter for the weights, "
                                            r"gradients and Muon \(momentum\) and AdamW state"):
        check_memory(muon, 50257, 2048, torch.device("cpu"))


def test_the_floor_stays_below_the_plan_by_more_than_its_error():
    """The refusal's floor is below the states plus 85% of the activations (the formula is
    within 15% of the measured peak), every family, with and without checkpointing: a run that
    fits is not refused for the formula's error."""
    for name in FAMILIES:
        lay, cfg = archs.layout(name), archs.config(name)
        for ac in (False, True):
            plan = memory.memory_plan(lay, cfg, 2, 128, checkpointing=ac)
            states = plan["params"] + plan["grads"] + plan["optimizer"]
            assert plan["floor"] <= states + 0.85 * plan["activations"], (name, ac)


# -- train --dry-run --world-size N --json ---------------------------------------------------

def dry_run(shards, *args):
    return CliRunner().invoke(train_cli, ["--shards", str(shards), "--dry-run", "--batch-size",
                                          "4", "--max-steps", "10", *map(str, args)])


def test_json_is_one_object_on_stdout_with_memory_per_process_and_fits(shards):
    r = dry_run(shards, "--json", "--world-size", 8, "--fsdp", "--precision", "bf16")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)  # the whole of stdout: one object
    mem = plan["memory_per_process"]
    assert set(mem) >= {"params", "grads", "optimizer", "activations", "total"}
    assert mem["total"] == sum(mem[k] for k in ("params", "grads", "optimizer", "buffers",
                                                "activations"))
    assert plan["fits"] is True and plan["world_size"] == 8 and plan["eta_seconds"] is None
    assert plan["tokens_per_step"] == 8 * 4 * 64  # the 8 processes' global batch
    assert "memory      per process (1 of 8 processes, FSDP (8 shards))" in r.stderr
    assert "not probed (--world-size 8" in r.stderr and "probe " not in r.stderr
    small = dry_run(shards, "--json", "--gpu-memory", 0.001)  # 1 MiB: nothing fits
    assert small.exit_code == 0 and json.loads(small.stdout)["fits"] is False
    assert "does NOT fit --gpu-memory 1.02 MiB" in small.stderr


def test_world_size_plans_a_5b_model_from_one_process_in_seconds(shards):
    start = time.perf_counter()
    r = dry_run(shards, "--model", "moe-5b", "--world-size", 64, "--fsdp", "--fsdp-replicas", 8,
                "--precision", "bf16", "--activation-checkpointing")
    assert r.exit_code == 0, r.output
    assert time.perf_counter() - start < 60
    assert "hybrid FSDP (8 replicas x 8 shards)" in r.output and "fits --gpu-memory" in r.output
    ddp = dry_run(shards, "--model", "moe-5b", "--world-size", 8)  # not this machine's: no refusal
    assert ddp.exit_code == 0 and "does NOT fit --gpu-memory 80.00 GiB" in ddp.output


def test_the_dry_run_names_the_optimizer_and_the_activations(shards):
    r = dry_run(shards, "--optimizer", "muon")
    assert r.exit_code == 0, r.output
    assert "Muon: a momentum on the matrices and experts" in r.output
    assert "activations" in r.output and "with --activation-checkpointing" in r.output
    assert "AdamW state" not in r.output
    fsdp = dry_run(shards, "--fsdp", "--activation-checkpointing")  # one process: probed too
    assert fsdp.exit_code == 0, fsdp.output
    assert "FSDP: blocks' unsharded weights" in fsdp.output
    assert "with activation checkpointing (without it" in fsdp.output and " s/step " in fsdp.output


def test_the_dry_run_flags_are_refused_without_dry_run_or_under_torchrun(shards, monkeypatch):
    r = CliRunner().invoke(train_cli, ["--shards", str(shards), "--world-size", "8"])
    assert r.exit_code == 2 and "--world-size: only with --dry-run" in r.output
    r = dry_run(shards, "--world-size", 3, "--fsdp", "--fsdp-replicas", 2)
    assert r.exit_code == 1 and "--fsdp-replicas 2 must divide the 3 processes" in r.output
    from longpack.training.dry_run import plan

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SettingsError, match="run the dry run without torchrun"):
        plan(TrainConfig(shards=str(shards)), world_size=8)


@pytest.mark.slow  # ~5 s of CPU: every preset's plan at 6 shapes and up to 6 shardings each
def test_the_table_in_train_md_is_the_planners(monkeypatch, capsys):
    """docs/TRAIN.md's table is what tools/plan_table.py prints (run in this process: the
    script is the test's subject, not the process it runs in)."""
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    monkeypatch.setattr(sys, "argv", [str(root / "tools" / "plan_table.py")])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the repository first
    runpy.run_path(str(root / "tools" / "plan_table.py"), run_name="__main__")
    assert capsys.readouterr().out.strip() in (root / "docs" / "TRAIN.md").read_text()


def test_a_world_size_past_any_cluster_is_one_line():
    from longpack.training.dry_run import plan

    with pytest.raises(SettingsError, match=r"--world-size must be at most 1,048,576 \(got "
                                            r"1073741824\)"):
        plan(TrainConfig(shards="anywhere"), world_size=2**30)


def test_the_dry_run_says_mamba_layers_run_their_plain_path_under_compile(shards):
    """MambaMixer.forward skips LeanMix while torch.compile traces it: the plan's activations
    are LeanMix's, so the dry run says they are not what a compiled run keeps."""
    from longpack.training.dry_run import render

    said = "  compile     Mamba layers run their plain path under --compile"
    r = dry_run(shards, "--model", "hybrid-tiny", "--compile", "--world-size", 1, "--json")
    assert r.exit_code == 0, r.output
    assert r.stderr.count(said) == 1 and r.stderr.index(said) < r.stderr.index("  memory  ")
    plan = json.loads(r.stdout)
    assert said in render(plan)
    for model, compiled in (("hybrid-tiny", False), ("neox-tiny", True)):  # no line
        config = {**plan["config"], "model": model, "compile": compiled}
        assert "  compile  " not in render({**plan, "config": config})


def test_a_gpu_memory_past_any_device_is_one_line(shards):
    r = dry_run(shards, "--gpu-memory", "1e308", "--world-size", 2)  # was an OverflowError
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert r.output.strip().splitlines()[-1] == ("Error: --gpu-memory must be a positive, finite "
                                                 "number of GiB, at most 1,048,576 (got 1e+308)")


def test_a_compiled_runs_depth_routed_blocks_are_planned_at_every_token():
    """A compiled run's doc_starts is as wide as its rows, so each depth-routed block runs T
    slots (archs/moe.py's mod_slots): its plan counts them; an eager run's, floor(c x T)."""
    from longpack.training.fits import plan_memory

    def planned(compile_: bool, capacity: float | None) -> int:
        args = ("mod_capacity=0.5",) if capacity else ()
        cfg = TrainConfig(shards="x", model="moe-tiny", model_args=args, compile=compile_,
                          batch_size=2)
        return plan_memory(cfg, 512, 256, 1)["activations"]

    assert planned(True, 0.5) > planned(False, 0.5)
    assert planned(True, None) == planned(False, None)  # without MoD the same plan
