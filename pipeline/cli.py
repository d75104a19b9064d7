"""`pack`: the data-stage command line. `pack build`'s flags are BuildConfig's fields
(longpack/settings.py); `pack stats`' are declared here."""

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

    from longpack.cli import Command, Group
    from longpack.settings import click_options
    from pipeline.adopt.config import ImportConfig
    from pipeline.config import BuildConfig
    from pipeline.distribute.launch import LaunchConfig
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
    from pipeline.distribute.launch import launch
    from pipeline.distribute.tasks import task_index_from_env, tasks_from_env
    from pipeline.manifest import already_complete, summary

    how = {f.name: settings.pop(f.name) for f in dataclasses.fields(LaunchConfig)}
    # the environment is read here only: a Slurm array or LONGPACK_TASK_* give the task
    if settings["tasks"] is None:
        settings["tasks"] = tasks_from_env()
    if settings["task_index"] is None:
        settings["task_index"] = task_index_from_env()
    cfg = BuildConfig(**settings)
    outcome = launch(cfg, LaunchConfig(**how), show_progress=False if quiet else None)
    if outcome.message and not quiet:
        click.echo(outcome.message)
    if outcome.manifest is not None and not quiet:
        if outcome.already_complete:
            click.echo(already_complete(outcome.manifest, cfg.out))
        click.echo(summary(outcome.manifest, cfg.out))
    if outcome.exit_code:
        sys.exit(outcome.exit_code)


@pack.command(cls=_ResumableCommand)
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--task-index", type=int, default=None, metavar="I",
              help="Only place task I's shards (one such command per task, in parallel); the "
              "last one to finish merges.")
@click.option("--quiet", is_flag=True, help="No summary.")
def merge(out, task_index, quiet):
    """Finish a build split into tasks (`pack build --tasks N`) once its tasks are done."""
    from pipeline.distribute import tasks
    from pipeline.manifest import summary

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
    """Adopt pretokenized rows (.npy, .pt, nanoGPT .bin) as a longpack build. Splits come from
    the names below SRC: val.bin, *_val_*.bin, val/ are val; train ones, or all of it when
    nothing is named, train; a test split or an unnamed file beside named ones is refused."""
    from pipeline.adopt.import_tokens import import_tokens
    from pipeline.manifest import summary

    cfg = ImportConfig(**settings)
    m = import_tokens(cfg, warn=lambda line: None if quiet else click.echo(line, err=True))
    if not quiet:
        click.echo(summary({**m, "timings": {**m["timings"], "steady_tokens_per_second": None}},
                           cfg.out).replace("pack build:", "pack import:", 1))


@pack.command()
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option("--verify", is_flag=True, help="Also check checksums, token ids, document starts and "
                   "continued documents' hashes.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (docs/STATS.md).")
@click.option("--decode", "decode", type=int, default=None, metavar="ROW",
              help="Print row ROW of --split as text with document boundaries marked.")
@click.option("--split", default="train", show_default=True, help="Split for --decode.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write document-length and token-frequency plots to this PNG.")
@click.option("--throughput", type=float, default=None, metavar="TOKENS/S",
              help="Training throughput, for a time estimate.")
@click.option("--budget", type=float, default=None, metavar="TOKENS",
              help="Training budget in tokens, for epochs and time.")
@click.option("--eos-id", type=int, default=None,
              help="EOS id for data without a manifest (plain .npy or other tools' MDS).")
@click.option("--mix", default=None, metavar="NAME=WEIGHT,...",
              help="Several builds: each one's share of the mixture, as train --mix takes them "
              "(PATH may be NAME=PATH; a bare path is named by its folder) [each in proportion "
              "to its train rows].")
def stats(paths, verify, as_json, decode, split, plot, throughput, budget, eos_id, mix):
    """Validate a build and report what it holds and what it will train; given several builds,
    also what their mixture gives."""
    import json

    from pipeline.stats import report as stats_report

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

    from longpack.errors import SettingsError
    from pipeline.mixture import parse_sources, parse_weights
    from pipeline.stats import mix as stats_mix
    from pipeline.stats import report as stats_report

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


if __name__ == "__main__":  # python -m pipeline.cli: the same command without the console script
    pack()
