"""Where each step's record goes: metrics.jsonl always; TensorBoard and W&B when asked for
(optional extras: a clear error when the package is missing, never a silent no-op)."""

import json
import math
import os
from pathlib import Path

from longpack.core import SettingsError, install_hint, no_follow, write_bytes, writing

# Dense bf16 peak FLOP/s by device name, for MFU (vendor datasheets).
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def check_installed(kinds: tuple[str, ...]) -> None:
    """Refuse --report-to tensorboard / wandb without the package, and wandb without a login
    (before a run makes anything: wandb.init's own refusal is a traceback after it)."""
    for kind, needs in unavailable(kinds):
        raise SettingsError(f"--report-to {kind} {needs}")


def unavailable(kinds) -> list[tuple[str, str]]:
    """(kind, what it needs) for each report backend of `kinds` this machine cannot use now:
    its package, or for W&B a login (asked of no one). A config file says these among its own
    problems (training/config_file.py), the command line through `check_installed`."""
    missing = {}
    for kind in ("tensorboard", "wandb"):
        if kind in kinds:
            try:
                _load(kind)
            except ImportError:
                missing[kind] = _needs_package(kind)
    offline = os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun")
    if "wandb" in kinds and "wandb" not in missing and not offline \
            and not _logged_in(_load("wandb")):
        missing["wandb"] = ("needs a W&B login this machine does not have: run `wandb login` "
                            "or set WANDB_API_KEY (or WANDB_MODE=offline to keep the records "
                            "locally)")
    return list(missing.items())


def _needs_package(kind: str) -> str:
    return f"needs the {kind} package: {install_hint(kind)}"


def _logged_in(wandb) -> bool:
    """Whether W&B has credentials, asking no one and reaching no server."""
    try:
        return bool(wandb.login(prompt=False, verify=False))
    except TypeError:  # a wandb before login(prompt=...): its older key lookup
        return bool(getattr(getattr(wandb, "api", None), "api_key", None))


def _import(kind: str):
    """The backend's writer (SummaryWriter) or module (wandb); SettingsError without it."""
    try:
        return _load(kind)
    except ImportError:
        raise SettingsError(f"--report-to {kind} {_needs_package(kind)}") from None


def _load(kind: str):
    if kind == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter
        return SummaryWriter
    import wandb
    return wandb


class MetricsLog:
    """metrics.jsonl in the run directory, and TensorBoard and W&B as cfg.report_to asks.
    `config`: the run's resolved config (training/loop.resolved_config), W&B's run config;
    `run_id`: the run's W&B id, kept in its checkpoints, so a resumed run continues its W&B run."""

    def __init__(self, run: Path, cfg, config: dict, run_id: str):
        self.path = run / "metrics.jsonl"
        self.tb = self.wandb = None
        # --init-from's record, which step 0's line carries (the config is W&B's alone)
        self.began_from = config.get("began_from")
        if "tensorboard" in cfg.report_to:
            self.tb = _import("tensorboard")(str(run / "tensorboard"))
            if self.began_from:
                self.tb.add_text("began_from", json.dumps(self.began_from))
        if "wandb" in cfg.report_to:
            self.wandb = _import("wandb").init(**wandb_settings(cfg), dir=str(run),
                                               config=config, id=run_id, resume="allow")

    def close(self) -> None:
        """The end of the run: TensorBoard's events flushed, the W&B run marked finished."""
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()

    def truncate(self, step: int) -> list[dict]:
        """Keep the lines of steps before `step` (a resumed run writes the later ones again) and
        return their records: the run's history so far, which no checkpoint holds."""
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _step(line) < step]
        write_bytes(self.path, "".join(kept).encode())
        return [json.loads(line) for line in kept]

    def write(self, record: dict) -> None:
        line = {**record, "began_from": self.began_from} if (
            record["step"] == 0 and self.began_from) else record
        bad = [k for k, v in line.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:  # JSON has no NaN (a val loss of weights gone wrong): None, and named
            line = {**line, **dict.fromkeys(bad), "nonfinite": sorted({*line.get("nonfinite", ()),
                                                                       *bad})}
        # a full disk is one line naming the file; a symlink at its name is never written through
        with writing(self.path), open(self.path, "a", opener=no_follow) as f:
            f.write(json.dumps(line) + "\n")
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float))}
        if self.tb is not None:
            for k, v in numbers.items():
                self.tb.add_scalar(k, v, record["step"])
        if self.wandb is not None:
            self.wandb.log(numbers, step=record["step"])


def wandb_settings(cfg) -> dict:
    """wandb.init's project, name, entity, group and tags from --wandb-*: the name is the run
    folder's (--out's last part) unless --wandb-run-name gives one; None leaves W&B's own."""
    name = cfg.wandb_run_name or cfg.out.rstrip("/").rsplit("/", 1)[-1] or None
    return {"project": cfg.wandb_project, "name": name, "entity": cfg.wandb_entity,
            "group": cfg.wandb_group, "tags": list(cfg.wandb_tags) or None}


def duration(seconds: float) -> str:
    """A time span as a person reads it: 45s, 12m 30s, 3h 05m, 2d 04h."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def _step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError):  # a line cut short by a crash
        return float("inf")


def peak_flops(device) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def matmul_rate(device) -> float | None:
    """FLOP/s this device's matrix units reach at best: a GPU's dense bf16 peak (PEAK_FLOPS;
    None for one not in it), a CPU's measured now, the best of a few fp32 matmuls of 1024 (a
    fraction of a second). A step's FLOPs over it are a floor on the step's time."""
    import time

    import torch

    if device.type != "cpu":
        return peak_flops(device)
    a = torch.randn(1024, 1024)
    best = float("inf")
    for _ in range(4):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * 1024**3 / best
