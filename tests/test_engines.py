"""Engines are a registry (pipeline/distribute/launch.py ENGINES): an engine is a module with
run(cfg, how, dest, show_progress) -> Outcome and one line there; `pack build --engine` offers
exactly the registered ones. This file is such a module itself."""

from longpack.pipeline.config import BuildConfig
from longpack.pipeline.distribute import launch as launch_mod
from longpack.pipeline.distribute.launch import LaunchConfig, Outcome, launch

CALLS = []


def run(cfg, how, dest, show_progress):  # the engine this file registers as "echo"
    CALLS.append((cfg.out, how.engine, dest.local, dest.url, show_progress))
    return Outcome(message=f"echo built {cfg.out}")


def test_an_engine_is_a_module_and_one_registry_line(tmp_path, monkeypatch):
    monkeypatch.setitem(launch_mod.ENGINES, "echo", __name__)
    cfg = BuildConfig(out=str(tmp_path / "o"), dataset="jsonl", inputs=("x.jsonl",))
    outcome = launch(cfg, LaunchConfig(engine="echo"), show_progress=False)
    assert outcome.message == f"echo built {tmp_path / 'o'}"
    assert CALLS == [(str(tmp_path / "o"), "echo", tmp_path / "o", None, False)]


def test_the_engine_flag_offers_exactly_the_registered_engines():
    from longpack.pipeline.cli import pack

    option = next(o for o in pack.commands["build"].params if o.name == "engine")
    assert list(option.type.choices) == list(launch_mod.ENGINES)
