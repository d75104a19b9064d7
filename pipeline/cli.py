"""`pack`: the data-stage command line. `pack build`'s flags are BuildConfig's fields
(longpack/core/settings.py); `pack stats`' are declared here."""

import sys

STARTING = "\ninterrupted while starting: nothing was written; re-run the command"
INTERRUPTED = "\ninterrupted: re-run the same command to resume"

# Ctrl+C while the command line loads exits as it does later: 130, one line, no traceback.
# Python's own start-up before this line (about 50 ms) and the few statements between loading
# this module and click's first call are out of reach: there Python prints its traceback.
try:
    import contextlib
    import dataclasses
    from pathlib import Path

    import click

    from longpack.core import Command, Group, click_options
    from longpack.pipeline.adopt.config import ImportConfig
    from longpack.pipeline.config import BuildConfig
    from longpack.pipeline.distribute.launch import LaunchConfig, MergeConfig
    from longpack.pipeline.stats.config import StatsConfig
except KeyboardInterrupt:
    sys.stderr.write(STARTING + "\n")
    sys.exit(130)


@contextlib.contextmanager
def _exit_130_on_interrupt(message: str):
    try:
        yield
    except KeyboardInterrupt:
        click.echo(message, err=True)
        sys.exit(130)


class _Group(Group):
    """Ctrl+C during click's own start-up and the group's parsing exits 130 as it does while
    the module loads (above), not with click's "Aborted!" and 1; each command's run is its own
    (`pack build`'s: _ResumableCommand)."""

    def main(self, *args, **kwargs):
        with _exit_130_on_interrupt(STARTING):
            return super().main(*args, **kwargs)

    def make_context(self, *args, **kwargs):
        with _exit_130_on_interrupt(STARTING):
            return super().make_context(*args, **kwargs)


class _ResumableCommand(Command):
    """Ctrl+C at any moment of `pack build`, from parsing its flags and importing the pipeline
    to printing the summary, exits 130 with the resume hint (click alone says "Aborted!" and
    exits 1 for an interrupt outside the build itself)."""

    def make_context(self, *args, **kwargs):
        with _exit_130_on_interrupt(INTERRUPTED):
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _exit_130_on_interrupt(INTERRUPTED):
            return super().invoke(ctx)


@click.group(cls=_Group)
@click.version_option(package_name="longpack")
def pack():
    """Turn web-scale text into packed long-context training shards."""


@pack.command(cls=_ResumableCommand)
@click_options(BuildConfig)
@click_options(LaunchConfig)
@click.option("--quiet", is_flag=True, help="No progress bar and no summary. Re-running a "
              "finished build does nothing and exits 0; without --quiet it says so.")
def build(quiet, **settings):
    """Tokenize documents and pack them into rows of exactly --seq tokens."""
    from longpack.pipeline.distribute.launch import launch
    from longpack.pipeline.distribute.tasks import task_index_from_env, tasks_from_env
    from longpack.pipeline.manifest import already_complete, summary
    from longpack.pipeline.store.destination import Destination

    how = {f.name: settings.pop(f.name) for f in dataclasses.fields(LaunchConfig)}
    # the environment is read here only: a Slurm array or LONGPACK_TASK_* give the task
    if settings["tasks"] is None:
        settings["tasks"] = tasks_from_env()
    if settings["task_index"] is None:
        settings["task_index"] = task_index_from_env()
    cfg = BuildConfig(**settings)
    # where the files are written and where they go: resolved here, once, and passed down
    outcome = launch(cfg, LaunchConfig(**how), False if quiet else None, Destination.of(cfg))
    if outcome.message and not quiet:
        click.echo(outcome.message)
    if outcome.manifest is not None and not quiet:
        if outcome.already_complete:
            click.echo(already_complete(outcome.manifest, cfg.out))
        click.echo(summary(outcome.manifest, cfg.out))
    if outcome.exit_code:
        sys.exit(outcome.exit_code)


@pack.command(cls=_ResumableCommand)
@click_options(MergeConfig)
@click.option("--quiet", is_flag=True, help="No summary.")
def merge(quiet, **settings):
    """Finish a build split into tasks (`pack build --tasks N`) once its tasks are done."""
    from longpack.pipeline.distribute import tasks
    from longpack.pipeline.manifest import summary

    cfg = MergeConfig(**settings)
    out, task_index = Path(cfg.out), cfg.task_index
    if task_index is not None:
        tasks.place_task(out, task_index)
        status = tasks.task_status(out)
        if len(status["placed"]) < status["tasks"]:
            if not quiet:
                click.echo(f"pack merge: task {task_index}'s shards placed")
            return
    manifest = tasks.merge(out)
    if not quiet:
        click.echo(summary(manifest, str(out)))



@pack.command("import")
@click_options(ImportConfig)
@click.option("--quiet", is_flag=True, help="No summary.")
def import_(quiet, **settings):
    """Adopt pretokenized rows (.npy, .npz, .pt, nanoGPT .bin) as a longpack build. Splits come from
    the names below SRC: val.bin, *_val_*.bin, val/ are val; train ones, or all of it when
    nothing is named, train; a test split or an unnamed file beside named ones is refused."""
    from longpack.pipeline.adopt.import_tokens import import_tokens
    from longpack.pipeline.manifest import summary

    cfg = ImportConfig(**settings)
    m = import_tokens(cfg, warn=lambda line: None if quiet else click.echo(line, err=True))
    if not quiet:
        click.echo(summary({**m, "timings": {**m["timings"], "steady_tokens_per_second": None}},
                           cfg.out).replace("pack build:", "pack import:", 1))


@pack.command()
@click_options(StatsConfig)
def stats(**settings):
    """Validate a build and report what it holds and what it will train; given several builds,
    also what their mixture gives."""
    import json

    from longpack.pipeline.stats import report as stats_report

    cfg = StatsConfig(**settings)
    paths, verify, as_json, decode, split = cfg.paths, cfg.verify, cfg.as_json, cfg.decode, \
        cfg.split
    plot = None if cfg.plot is None else Path(cfg.plot)
    throughput, budget, eos_id, mix = cfg.throughput, cfg.budget, cfg.eos_id, cfg.mix
    if len(paths) > 1:
        return _stats_mix(paths, verify, as_json, decode, plot, throughput, budget, eos_id, mix)
    if mix is not None:
        raise click.UsageError("--mix needs two or more builds: pack stats web=./fw "
                               "code=./code --mix web=0.7,code=0.3")
    if decode is not None:
        click.echo(stats_report.decode_row(paths[0], split, decode, eos_id))
        return
    report = stats_report.collect(paths[0], verify, throughput, budget, eos_id)
    if plot is not None:
        stats_report.plot(report, plot)
    click.echo(json.dumps(report, indent=2) if as_json else stats_report.render(report))
    if not report["checks"]["ok"]:
        sys.exit(1)


def _stats_mix(paths, verify, as_json, decode, plot, throughput, budget, eos_id, mix):
    """`pack stats A B [--mix ...]`: each build's report, then the mixture's (stats/mix.py)."""
    import json

    from longpack.core import SettingsError
    from longpack.pipeline.mixture import parse_sources, parse_weights
    from longpack.pipeline.stats import mix as stats_mix
    from longpack.pipeline.stats import report as stats_report

    for flag, used in (("--decode", decode is not None), ("--plot", plot is not None)):
        if used:
            raise click.UsageError(f"{flag} reads one build: give one PATH")
    try:
        sources = parse_sources(paths, "pack stats")
        names = [n for n, _ in sources]
        weights = parse_weights(mix, names) if mix is not None else None
    except SettingsError as e:
        raise click.UsageError(str(e)) from None
    reports = stats_mix.collect_all(sources, verify, throughput, budget, eos_id)
    mixture = stats_mix.mixture(names, reports, weights, budget, throughput)
    if as_json:
        click.echo(json.dumps({"builds": dict(zip(names, reports)), "mixture": mixture},
                              indent=2))
    else:
        click.echo("\n\n".join([*map(stats_report.render, reports), stats_mix.render(mixture)]))
    if not all(r["checks"]["ok"] for r in reports):
        sys.exit(1)


if __name__ == "__main__":  # python -m longpack.pipeline.cli: the command without its script
    pack()
