"""Issue 31, the trainer's knobs the seeds use: the next-token loss and each auxiliary term
logged apart, `zoo eval` on the run's windows, console steps as metrics.jsonl numbers them, W&B's
run settings and config, Muon's own settings, the loader's prefetch depth and the nearest name for
an unknown setting (the example configs in configs/: tests/test_configs.py)."""

import dataclasses
import json
import sys
import time
import types

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_train import padded_build

from conftest import vocab_of
from longpack import archs
from longpack.core.errors import SettingsError
from longpack.training.cli import train as train_cli
from longpack.training.config import TrainConfig
from longpack.training.data.loader import make_batch
from longpack.training.loop import train
from longpack.training.parallel.distributed import launched
from longpack.zoo.cli import zoo

MOE = ("n_pred_tokens=2", "mod_capacity=0.5")  # MTP and a depth-routed block: every aux term


def config(shards, out, **kw):
    base = dict(shards=str(shards), model="neox-tiny", out=str(out), batch_size=4, max_steps=2,
                warmup=1, lr=3e-3, save_every=100, log_every=1, workers=0)
    return TrainConfig(**{**base, **kw})


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# -- lm_loss and the auxiliary terms --------------------------------------------------------

@pytest.mark.slow
def test_lm_loss_is_the_next_token_loss_over_the_steps_real_targets(tmp_path, byte_tokenizer):
    # Each step is the build's two train rows, 64 real targets and 4, here as two micro-batches
    # of one row: lm_loss must be the mean over the 68 (as `loss` is), not of the two means,
    # and equal the cross-entropy of the untrained model on both rows at once.
    shards = padded_build(tmp_path, byte_tokenizer)
    said = []
    history = train(config(shards, tmp_path / "r", model="moe-tiny", model_args=MOE,
                           batch_size=1, grad_accum=2, max_steps=1, eval_every=1),
                    log=said.append)
    first = history[0]
    torch.manual_seed(0)  # the run's seed: its initial weights
    model = archs.build("moe-tiny", vocab_size=50257, **archs.parse_args("moe-tiny", list(MOE)))
    from longpack.pipeline.builds.reader import open_build

    build = open_build(str(shards), tmp_path / "cache", "1gb")
    batch = make_batch([build.train.get(i) for i in range(len(build.train))])
    with torch.no_grad():
        whole = model.loss(batch["input_ids"], batch["targets"], batch["doc_starts"])
    assert first["targets"] == 68
    assert first["lm_loss"] == pytest.approx(whole["ce"].item(), rel=1e-5)
    assert first["loss"] == pytest.approx(first["lm_loss"] + first["aux_loss"], rel=1e-6)
    assert {"aux/balance", "aux/z_loss", "aux/mtp", "aux/mod_predictor", "aux/dropped"} <= set(first)
    assert first["aux/mtp"] > 0 and first["aux_loss"] > 0
    # the val loss is the same kind: next-token only
    assert first["val_lm_loss"] == first["val_loss"]
    line = next(s for s in said if s.startswith("step"))
    assert f" lm {first['lm_loss']:.4f} aux {first['aux_loss']:.4f} " in line
    assert f" val {first['val_lm_loss']:.4f}" in line
    on_disk = records(tmp_path / "r")[0]
    assert on_disk["lm_loss"] == first["lm_loss"] and on_disk["aux/mtp"] == first["aux/mtp"]


def test_a_model_without_auxiliary_terms_logs_lm_loss_as_its_loss(tmp_path, shards):
    said = []
    history = train(config(shards, tmp_path / "r"), log=said.append)
    assert all(h["lm_loss"] == h["loss"] and h["aux_loss"] == 0 for h in history)
    assert not [k for k in history[0] if k.startswith("aux/")]
    line = next(s for s in said if s.startswith("step"))
    assert f"loss {history[0]['loss']:.4f} lm {history[0]['lm_loss']:.4f} lr " in line


@pytest.mark.slow
def test_lm_loss_is_the_global_mean_over_processes(tmp_path, byte_tokenizer):
    # 2 processes of one row each (64 and 4 real targets) = 1 process of both rows, as two
    # micro-batches (MoE's balance and z terms are of the tokens a forward routes together)
    from test_train_distributed import COMMON, torchrun

    shards = padded_build(tmp_path, byte_tokenizer)
    one = train(TrainConfig(shards=str(shards), out=str(tmp_path / "one"), batch_size=1,
                            grad_accum=2, **{**COMMON, "model": "moe-tiny"}, model_args=MOE),
                log=lambda m: None)
    torchrun(shards, tmp_path / "two", "--model", "moe-tiny", *[a for m in MOE
                                                               for a in ("--model-arg", m)],
             batch=1)
    two = records(tmp_path / "two")
    for key in ("loss", "lm_loss", "aux_loss", "aux/mtp", "aux/balance"):
        # step 0: the same weights; after it, the processes' gradient sums round otherwise,
        # AdamW scales that up where gradients are near zero, and MoE's routing follows
        assert two[0][key] == pytest.approx(one[0][key], rel=1e-5), key
        assert [h[key] for h in two] == pytest.approx([h[key] for h in one], rel=1e-3), key


# -- zoo eval --seq -------------------------------------------------------------------------

def test_zoo_eval_scores_the_windows_the_run_trained_on(tmp_path, shards):
    run = tmp_path / "r"
    train(config(shards, run, seq=13, eval_batches=2), log=lambda m: None)
    final = records(run)[-1]

    def evaluate(*args):
        r = CliRunner().invoke(zoo, ["eval", str(run), "--shards", str(shards), "--batch-size",
                                     "4", *args])
        assert r.exit_code == 0, r.output
        return r

    got = json.loads(evaluate("--limit", "8", "--json").output)  # eval_batches x batch_size
    assert got["seq"] == 13 and got["targets"] == final["val_targets"]
    assert got["loss"] == pytest.approx(final["val_loss"], abs=1e-6)
    whole = json.loads(evaluate("--limit", "8", "--seq", "65", "--json").output)
    assert whole["seq"] == 65 and whole["targets"] != got["targets"]  # whole rows: others
    assert "windows of 13 tokens" in evaluate("--limit", "8").output
    r = CliRunner().invoke(zoo, ["eval", str(run), "--shards", str(shards), "--seq", "24"])
    assert r.exit_code == 1 and "--seq 24: the rows of" in r.output and "65" in r.output


# -- W&B ------------------------------------------------------------------------------------

class FakeWandb(types.ModuleType):
    """What MetricsLog uses of wandb: init (its keyword arguments kept), log, finish."""

    def __init__(self, logged_in=True):
        super().__init__("wandb")
        self.inits, self.logged, self.finished = [], [], 0
        self.logged_in = logged_in

    def login(self, prompt=True, verify=True):
        assert not prompt and not verify  # asks no one, reaches no server
        return self.logged_in

    def init(self, **kw):
        self.inits.append(kw)
        return self

    def log(self, data, step=None):
        self.logged.append((step, data))

    def finish(self):
        self.finished += 1


def test_wandb_gets_the_run_settings_and_its_resolved_config(tmp_path, shards, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    toml = tmp_path / "run.toml"
    toml.write_text(f'shards = "{shards}"\nbatch_size = 2\nworkers = 0\nwarmup = 1\n'
                    'total_tokens = 300\n[logging]\nreport_to = ["jsonl", "wandb"]\n'
                    'wandb_project = "seeds"\nwandb_entity = "lab"\nwandb_group = "neox"\n'
                    'wandb_tags = ["tiny", "test"]\n')
    r = CliRunner().invoke(train_cli, ["--config", str(toml), "--out", str(tmp_path / "r"),
                                       "--wandb-run-name", "first"])
    assert r.exit_code == 0, r.output
    (init,) = fake.inits
    assert {k: init[k] for k in ("project", "name", "entity", "group", "tags")} == {
        "project": "seeds", "name": "first", "entity": "lab", "group": "neox",
        "tags": ["tiny", "test"]}
    resolved = init["config"]
    assert resolved["max_steps"] == 3 and resolved["total_tokens"] is None  # 300 / (2 x 64)
    assert resolved["seq"] == 65 and resolved["world_size"] == 1
    assert resolved["global_batch"] == 2 and resolved["tokens_per_step"] == 128
    assert resolved["model_config"]["vocab_size"] == vocab_of(shards) and resolved["params"] > 0
    assert resolved["wandb_tags"] == ("tiny", "test") and resolved["lr"] == 3e-4
    assert [step for step, _ in fake.logged] == [0, 1, 2]
    assert "lm_loss" in fake.logged[0][1] and fake.finished == 1
    # the defaults: project longpack, the run folder's name; tags from the comma form
    from longpack.training.metrics import wandb_settings

    assert wandb_settings(TrainConfig(shards="x", out="runs/plain/", wandb_tags="a, b")) == {
        "project": "longpack", "name": "plain", "entity": None, "group": None,
        "tags": ["a", "b"]}
    assert wandb_settings(TrainConfig(shards="x"))["tags"] is None
    # a resume continues the same W&B run (its id is in the checkpoint); a fresh start does not
    r = CliRunner().invoke(train_cli, ["--config", str(toml), "--out", str(tmp_path / "r"),
                                       "--total-tokens", "600"])
    assert r.exit_code == 0, r.output
    assert fake.inits[1]["id"] == init["id"] and fake.inits[1]["resume"] == "allow"
    assert [step for step, _ in fake.logged[3:]] == [3, 4]
    r = CliRunner().invoke(train_cli, ["--config", str(toml), "--out", str(tmp_path / "r"),
                                       "--resume", "never"])
    assert r.exit_code == 0, r.output
    assert fake.inits[2]["id"] != init["id"]


def test_wandb_without_a_login_is_one_line_before_anything_is_made(tmp_path, shards,
                                                                   monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", FakeWandb(logged_in=False))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "r"
    r = CliRunner().invoke(train_cli, ["--shards", str(shards), "--out", str(out),
                                       "--report-to", "console,wandb"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "--report-to wandb needs a W&B login this machine does not have: run `wandb login` " \
        "or set WANDB_API_KEY" in r.output
    assert not out.exists()
    monkeypatch.setenv("WANDB_MODE", "offline")  # records kept locally: no login needed
    from longpack.training.metrics import check_installed

    check_installed(("console", "wandb"))


# -- Muon's settings ------------------------------------------------------------------------

def test_muon_takes_its_own_lr_momentum_and_newton_schulz_steps():
    from longpack.training.optim import lr_at, make_optimizers, set_lr
    from longpack.training.step import prepare, train_step

    torch.manual_seed(0)
    model = archs.build("neox-tiny", vocab_size=300)
    x = torch.randint(0, 300, (4, 33))
    batch = {"input_ids": x[:, :-1], "targets": x[:, 1:], "doc_starts": torch.zeros(4, 1).long()}
    model.loss(**batch)["loss"].backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = TrainConfig(shards="x", optimizer="muon", lr=0.01, min_lr=0.001, weight_decay=0.1,
                      warmup=0, clip=0, muon_lr=0.05, muon_momentum=0.8, muon_ns_steps=3)
    train_step(prepare(model, cfg, launched()), [batch], 0, cfg, launched())
    roles = model.param_roles()
    for n, p in model.named_parameters():
        if roles[n] != "matrix":
            continue
        alone = torch.nn.Parameter(before[n].clone())
        alone.grad = grads[n]
        torch.optim.Muon([alone], lr=0.05, weight_decay=0.1, momentum=0.8, ns_steps=3).step()
        assert torch.allclose(p.detach(), alone.detach(), atol=1e-6), n
        default = torch.nn.Parameter(before[n].clone())
        default.grad = grads[n]
        torch.optim.Muon([default], lr=0.05, weight_decay=0.1).step()
        assert not torch.allclose(p.detach(), default.detach(), atol=1e-6), n  # 0.95, 5 differ
    # the schedule scales Muon's lr as it scales --lr; AdamW keeps --lr's
    muon, adamw = make_optimizers(model, cfg)
    set_lr([muon, adamw], lr_at(50, cfg), cfg)
    assert muon.param_groups[0]["lr"] == pytest.approx(lr_at(50, cfg) * 5)
    assert adamw.param_groups[0]["lr"] == lr_at(50, cfg)
    assert muon.param_groups[0]["momentum"] == 0.8 and muon.param_groups[0]["ns_steps"] == 3
    plain = make_optimizers(model, TrainConfig(shards="x", optimizer="muon", lr=0.01))[0]
    assert plain.param_groups[0]["lr"] == 0.01 and plain.param_groups[0]["ns_steps"] == 5


def test_muon_settings_are_checked():
    for bad, message in ((dict(muon_lr=0.0, optimizer="muon"), "--muon-lr must be positive"),
                         (dict(muon_momentum=1.0, optimizer="muon"), r"--muon-momentum must be in"),
                         (dict(muon_ns_steps=0, optimizer="muon"), r"--muon-ns-steps must be in"),
                         (dict(muon_ns_steps=100, optimizer="muon"), r"--muon-ns-steps must be in"),
                         (dict(muon_lr=0.02), "--muon-lr: Muon's settings, for --optimizer muon")):
        with pytest.raises(SettingsError, match=message):
            TrainConfig(shards="x", **bad)


@pytest.mark.slow
def test_a_run_with_muon_settings_resumes_exactly(tmp_path, shards):
    muon = dict(optimizer="muon", muon_lr=0.02, muon_momentum=0.9, muon_ns_steps=4,
                save_every=2, max_steps=4)
    straight = train(config(shards, tmp_path / "a", **muon), log=lambda m: None)
    train(config(shards, tmp_path / "b", **muon), log=lambda m: None, stop_at=2)
    resumed = train(config(shards, tmp_path / "b", **muon), log=lambda m: None)
    assert [h["loss"] for h in resumed] == [h["loss"] for h in straight]


# -- --prefetch -----------------------------------------------------------------------------

class CountedRows:
    """Rows of 9 tokens; every get() counted in memory the forked workers share."""

    def __init__(self, n: int):
        import multiprocessing

        self.n, self.reads = n, multiprocessing.get_context("fork").Value("i", 0)

    def __len__(self):
        return self.n

    def get(self, i):
        with self.reads.get_lock():
            self.reads.value += 1
        return np.full(9, i, np.uint16), np.array([0]), np.array([1], np.uint64)


@pytest.mark.parametrize("prefetch", [1, 3])
def test_prefetch_is_how_many_batches_a_worker_builds_ahead(prefetch):
    from longpack.training.data.loader import StepBatches, batches
    from longpack.training.data.mixture import GlobalOrder

    rows = CountedRows(64)
    order = GlobalOrder(len(rows), 1, seed=0, fingerprint="f")
    stream = batches(StepBatches(order, rows, 0, 1, 1, 1), 0, 50, workers=1, prefetch=prefetch)
    next(stream)  # the trainer holds one slot; the worker fills the others, then waits
    deadline = time.time() + 60  # however loaded the machine: wait for the slots to fill
    while rows.reads.value < 1 + prefetch and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # and then a while in which a worker that did not wait would read on
    assert rows.reads.value == 1 + prefetch  # row 0, read once for the slots' layout
    stream.close()
    with pytest.raises(SettingsError, match=r"--prefetch must be in 1\.\.1024 \(got 0\)"):
        TrainConfig(shards="x", prefetch=0)


# -- the nearest name -----------------------------------------------------------------------

@pytest.mark.parametrize("theirs, ours", [
    ("batchsize", "batch_size"), ("warmup_step", "warmup"), ("prefetch_factor", "prefetch"),
    ("max_step", "max_steps"), ("sequence", "seq"), ("grad_acum", "grad_accum"),
    ("learning_rate", None),  # another trainer's name, not a misspelling: no guess (a config
    # file answers it from training/names.py)
])
def test_an_unknown_setting_names_the_nearest_known_one(theirs, ours):
    from longpack.core.settings import refuse_unknown

    known = [f.name for f in dataclasses.fields(TrainConfig)]
    with pytest.raises(SettingsError) as e:
        refuse_unknown([theirs], known, "run.toml")
    said = f"run.toml: unknown setting {theirs}"
    assert str(e.value) == said + (f" (did you mean {ours}?)" if ours else "")


def test_the_nearest_name_in_a_config_file_and_for_model_args(tmp_path, shards):
    toml = tmp_path / "run.toml"
    toml.write_text('learning_rate = 0.1\nnonsense = 1\nmax_step = 3\n')
    r = CliRunner().invoke(train_cli, ["--config", str(toml)])
    assert r.exit_code == 2  # every unknown key at once
    assert "learning_rate: 0.1 -> lr: 0.1 (the peak learning rate); unknown settings nonsense, " \
        "max_step (did you mean max_steps?)" in " ".join(r.output.split())
    toml.write_text('[optim]\ngrad_acum = 4\n')
    r = CliRunner().invoke(train_cli, ["--config", str(toml)])
    assert r.exit_code == 2 and "unknown setting optim.grad_acum (did you mean " \
        "optim.grad_accum?)" in " ".join(r.output.split())
    toml.write_text(f'shards = "{shards}"\n[model]\nname = "moe-tiny"\nnum_experts = 4\n')
    r = CliRunner().invoke(train_cli, ["--config", str(toml), "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "model.num_experts: 4 -> model.n_experts: 4" in \
        " ".join(r.output.split())  # a transformers config's name: ours, not a near spelling
    toml.write_text(f'shards = "{shards}"\n[model]\nname = "moe-tiny"\nn_expert = 4\n')
    r = CliRunner().invoke(train_cli, ["--config", str(toml), "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "unknown setting model.n_expert (did you mean " \
        "model.n_experts?)" in " ".join(r.output.split())
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("chunk", [None, 100])
def test_clipping_does_not_depend_on_how_the_gradients_are_split(chunk, monkeypatch):
    """The clip coefficient from a float64 norm: the same float32 update whether a gradient is
    one tensor or shards of it (FSDP's), which float32 sums are not; torch's arithmetic
    otherwise. `chunk`: the float64 sums taken a few elements at a time, as for a large
    tensor."""
    from longpack.training import step
    from longpack.training.step import clip_gradients

    if chunk:
        monkeypatch.setattr(step, "SQUARES_CHUNK", chunk)

    def clipped(pieces, max_norm):
        params = [torch.nn.Parameter(torch.zeros_like(g)) for g in pieces]
        for p, g in zip(params, pieces):
            p.grad = g.clone()
        norm = clip_gradients(params, max_norm)
        return norm, torch.cat([p.grad for p in params])

    torch.manual_seed(0)
    for _ in range(20):
        grad = torch.randn(4099) * 10
        cut = int(torch.randint(1, 4098, ()))
        whole_norm, whole = clipped([grad], 1.0)
        split_norm, split = clipped([grad[:cut], grad[cut:]], 1.0)
        assert torch.equal(whole, split)
        assert whole_norm.dtype == torch.float64
        assert whole_norm == pytest.approx(float(grad.double().norm()), rel=1e-12)
        theirs = [torch.nn.Parameter(torch.zeros_like(grad))]
        theirs[0].grad = grad.clone()
        torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        assert torch.allclose(whole, theirs[0].grad, rtol=1e-6, atol=0)
    small = torch.full((8,), 0.01)
    assert torch.equal(clipped([small], 1.0)[1], small)  # under the norm: untouched
    assert torch.equal(clipped([grad], 0)[1], grad)  # 0: clipping off
