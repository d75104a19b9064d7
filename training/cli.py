"""`train`: the trainer's command line. Each flag is declared once, here, from TrainConfig."""

from dataclasses import MISSING, fields
from typing import get_args

import click

from training.config import TrainConfig


def _config_options(func):
    """One click option per TrainConfig field, its help taken from the field's docstring."""
    import ast
    import inspect

    import training.config as module

    docs, tree = {}, ast.parse(inspect.getsource(module))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef)).body
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    for f in reversed(fields(TrainConfig)):
        flag = "--" + f.name.replace("_", "-")
        kinds = [t for t in (f.type, *get_args(f.type)) if t in (int, float, bool)]
        kind = kinds[0] if kinds else str  # `int | None` -> int
        if f.name == "log":  # a tuple: repeat the flag
            func = click.option(flag, f.name, multiple=True, default=f.default,
                                show_default=True, help=docs.get(f.name))(func)
        elif kind is bool:
            func = click.option(f"{flag}/--no-{flag[2:]}", f.name, default=f.default,
                                show_default=True, help=docs.get(f.name))(func)
        else:
            func = click.option(flag, f.name, type=kind,  # required ones checked in TrainConfig
                                default=None if f.default is MISSING else f.default,
                                show_default=f.default is not MISSING,
                                help=docs.get(f.name))(func)
    return func


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--list-models", is_flag=True, help="Print the model zoo's presets and exit.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="TOML or YAML file of settings (keys as the flags, with _); flags given on "
                   "the command line override it.")
@click.option("--dry-run", is_flag=True, help="Print the plan (steps, epochs, FLOPs, memory, "
              "ETA from probe steps on this device) and exit.")
@click.option("--resume", default="auto", show_default=True,
              help="auto (newest complete checkpoint in --out), never, or a checkpoint dir.")
@_config_options
@click.version_option(package_name="longpack")
@click.pass_context
def train(ctx, list_models, config_file, dry_run, resume, **settings):
    """Train a model from archs/ on shards written by `pack build` (docs/TRAIN.md)."""
    if list_models:
        import runpy

        runpy.run_module("archs", run_name="__main__")
        return
    from pipeline.errors import LongpackError
    from training import distributed
    from training.loop import train as run_training

    if config_file:
        from_file = load_settings(config_file)
        unknown = set(from_file) - set(settings)
        if unknown:
            raise click.UsageError(f"{config_file}: unknown settings {', '.join(sorted(unknown))}")
        given = {k for k in settings
                 if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE}
        settings.update({k: v for k, v in from_file.items() if k not in given})
    if settings["shards"] is None:
        raise click.UsageError("--shards is required: the --out of a pack build")
    settings["log"] = tuple(settings["log"])
    try:
        cfg = TrainConfig(**settings)
        if dry_run:
            from training.plan import plan, render

            report = render(plan(cfg))
            if distributed.launched().main:  # torchrun: the first process speaks
                click.echo(report)
            return
        history = run_training(cfg, resume=resume, log=click.echo)
    except (ValueError, LongpackError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from None
    if history and distributed.launched().main:
        losses = [h["loss"] for h in history if h["loss"] is not None]  # None: padding only
        loss = f", loss {losses[-1]:.4f}" if losses else ""
        click.echo(f"done: step {history[-1]['step'] + 1}{loss}; checkpoints in {cfg.out}")


def load_settings(path: str) -> dict:
    text = open(path, "rb").read()
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError:
            raise click.UsageError("a YAML --config needs PyYAML: pip install pyyaml") from None
        data = yaml.safe_load(text) or {}
    else:
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise click.UsageError("a TOML --config needs Python 3.11 or later; use YAML") from None
        try:
            data = tomllib.loads(text.decode())
        except tomllib.TOMLDecodeError as e:
            raise click.UsageError(f"{path}: not valid TOML ({e})") from None
    if not isinstance(data, dict):
        raise click.UsageError(f"{path}: expected a table of settings")
    return {k.replace("-", "_"): v for k, v in data.items()}
