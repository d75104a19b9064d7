"""`train`: the trainer's command line; its settings' flags are TrainConfig's fields
(longpack/core/settings.py), the rest are declared here."""

import click

from longpack.core import Command, OneLineUsageError, SettingsError, click_options
from longpack.training.config import TrainConfig


class _Shards(click.Option):
    """--shards: required (so `--help` says so), except by --list-models, which may go without
    it. A value from --config counts (click's default_map)."""

    def process_value(self, ctx, value):
        if ctx.params.get("list_models") and self.value_is_missing(value):  # eager: seen first
            return None
        return super().process_value(ctx, value)


# `train --help` in sections, each from its first setting on (TrainConfig declares them in this
# order); the command's own flags come first, under "Run".
HELP_SECTIONS = {"shards": "Data", "model": "Model", "out": "Where the run goes",
            "batch_size": "Batch and length", "lr": "Learning rate and optimizer",
            "precision": "Step", "fsdp": "Parallelism and memory", "workers": "Loader and cache",
            "save_every": "Checkpoints and evaluation", "report_to": "Reports",
            "version": "Other"}


GIVEN = "longpack.train.given"  # ctx.meta's key: the parameters the command line gives


class GroupedHelp(Command):
    def parse_args(self, ctx, args):
        # --config is read first (eager), before the other flags are processed: it is told
        # which settings the command line gives (parsed, not yet processed), whose checks
        # against the file's values are then the flags' own
        opts, _, _ = self.make_parser(ctx).parse_args(args=list(args))
        ctx.meta[GIVEN] = frozenset(opts)
        return super().parse_args(ctx, args)

    def format_options(self, ctx, formatter):
        sections, title = {}, "Run"
        for param in self.get_params(ctx):
            title = HELP_SECTIONS.get(param.name, title)
            record = param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(title, []).append(record)
        for title, records in sections.items():
            with formatter.section(title):
                formatter.write_dl(records)


def _read_config_file(ctx, _param, path):
    """--config: the file's settings (training/config_file.py: every problem in one line, other
    trainers' names with ours), checked as the Python API's are (longpack/core/settings.py), become
    the defaults of the flags (click's default_map), so a flag on the command line wins and
    --shards may come from the file. The rules and report backends the file's values break are
    in its error, but for those a flag given takes part in (GIVEN), which TrainConfig checks."""
    from longpack.training import config_file

    if path is None:
        return None
    try:
        settings = config_file.read(path, ctx.meta.get(GIVEN, ()))
    except SettingsError as e:  # the line names the file: no pointer to --help
        raise OneLineUsageError(str(e), points_to_help=False) from None
    ctx.default_map = {**(ctx.default_map or {}), **settings}
    return path


def _renamed_log(ctx, _param, value):
    if value is not None:
        raise click.UsageError("--log is now --report-to (torchrun takes --log for its own "
                               "--log-dir), e.g. --report-to console,jsonl")


@click.command(cls=GroupedHelp)
@click.option("--list-models", is_flag=True, is_eager=True,
              help="Print the model zoo's presets and exit: sized at the build's vocabulary "
                   "with --shards, else at each preset's own.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              is_eager=True, expose_value=False, callback=_read_config_file,
              help="TOML or YAML file of settings (keys as the flags, with _); flags given on "
                   "the command line override it.")
@click.option("--dry-run", is_flag=True, help="Print the plan (steps, epochs, FLOPs, memory, "
              "ETA from probe steps on this device) and exit.")
@click.option("--world-size", type=int, metavar="N",
              help="--dry-run: plan for N processes from this one (memory per process, sharded "
                   "under --fsdp; the global batch), launching nothing and probing nothing.")
@click.option("--gpu-memory", type=float, default=80.0, show_default=True, metavar="GIB",
              help="--dry-run: the memory of each process's GPU that the plan must fit, GiB.")
@click.option("--json", "as_json", is_flag=True,
              help="--dry-run: print the plan as one JSON object (memory_per_process in bytes, "
                   "fits) on stdout; the usual lines go to stderr.")
@click.option("--resume", default="auto", show_default=True,
              help="auto (newest complete checkpoint in --out, or in the bucket of an --out "
                   "URL or --upload when newer: a fresh machine fetches it), never, or a "
                   "checkpoint dir or its URL.")
@click.option("--log", hidden=True, expose_value=False, callback=_renamed_log)
@click_options(TrainConfig, shards=_Shards)
@click.version_option(package_name="longpack")
def train(list_models, dry_run, world_size, gpu_memory, as_json, resume, **settings):
    """Train a model from archs/ on shards written by `pack build` (docs/TRAIN.md)."""
    import sys

    from longpack.training.console import Console
    from longpack.training.loop import train as run_training
    from longpack.training.parallel import distributed

    ctx = click.get_current_context()
    given = [f"--{name.replace('_', '-')}" for name in ("world_size", "gpu_memory", "json")
             if ctx.get_parameter_source("as_json" if name == "json" else name)
             is not click.core.ParameterSource.DEFAULT]
    if given and not dry_run:
        raise click.UsageError(f"{', '.join(given)}: only with --dry-run (they shape its plan)")
    if not 0 < gpu_memory <= 2**20:  # 1 PiB, past any device; its bytes (x 2**30) an int
        raise click.UsageError(f"--gpu-memory must be a positive, finite number of GiB, at most "
                               f"{2**20:,} (got {gpu_memory})")
    if list_models:
        from longpack.training.presets import presets_of_build

        click.echo(presets_of_build(settings["shards"], settings["seq"]))
        return
    cfg = TrainConfig(**settings)
    if dry_run:
        dry_run_plan(cfg, world_size, gpu_memory, as_json)
        return
    say = Console(click.echo)  # a reader gone (`| head -1`) drops lines, never the run
    history = run_training(cfg, resume=resume, log=say)
    if history.stopped_by:  # "stopped at step N" was the last line; exit as the signal would
        sys.exit(128 + history.stopped_by)
    if history and distributed.launched().main:
        losses = [h["loss"] for h in history if h["loss"] is not None]  # None: padding only
        loss = f", loss {losses[-1]:.4f}" if losses else ""
        say(f"done: step {history[-1]['step'] + 1}{loss}; checkpoints in {cfg.out}")


def dry_run_plan(cfg: TrainConfig, world_size: int | None, gpu_memory: float,
                 as_json: bool) -> None:
    """`--dry-run`: the plan's lines on stdout (the first process's under torchrun), or with
    --json on stderr and then one JSON object alone on stdout: anything else that would print to
    stdout meanwhile is sent to stderr too."""
    import contextlib
    import json
    import sys

    from longpack.training.dry_run import plan
    from longpack.training.parallel import distributed

    main = distributed.launched().main
    say = (lambda line: click.echo(line, err=True)) if as_json else click.echo
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        p = plan(cfg, say=say if main else lambda _: None, world_size=world_size,
                 gpu_memory=int(gpu_memory * 2**30))
    if as_json and main:
        click.echo(json.dumps(p, default=str))
