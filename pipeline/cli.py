"""`pack`: the data-stage command line. Every flag is declared once, here."""

import sys

STARTING = "\ninterrupted while starting: nothing was written; re-run the command"
INTERRUPTED = "\ninterrupted: re-run the same command to resume"

# Ctrl+C while the command line loads exits as it does later: 130, one line, no traceback.
# Python's own start-up before this line (about 50 ms) and the few statements between loading
# this module and click's first call are out of reach: there Python prints its traceback.
try:
    import contextlib
    import os
    from pathlib import Path

    import click

    from pipeline.catalog import DATASETS
    from pipeline.config import (
        FORMATS,
        LAST_ROW_POLICIES,
        SHARD_BYTES,
        TOKENIZER_ENGINES,
        BuildConfig,
    )
    from pipeline.errors import LongpackError
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


class _Group(click.Group):
    """Ctrl+C during click's own start-up and the group's parsing exits 130 as it does while
    the module loads (above), not with click's "Aborted!" and 1; each command's run is its own
    (`pack build`'s: _ResumableCommand)."""

    def main(self, *args, **kwargs):
        with _exit_130_on_interrupt(STARTING):
            return super().main(*args, **kwargs)

    def make_context(self, *args, **kwargs):
        with _exit_130_on_interrupt(STARTING):
            return super().make_context(*args, **kwargs)


class _ResumableCommand(click.Command):
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
@click.option("--dataset", type=click.Choice(list(DATASETS)), default="fineweb-edu",
              show_default=True, help="Named dataset: text field, file patterns, hub location.")
@click.option("--input", "inputs", multiple=True, metavar="PATH",
              help="File, directory or glob (repeatable). Without it the dataset is fetched "
                   "from the Hugging Face hub.")
@click.option("--subset", default=None, help="Hub subset, e.g. sample-10BT (the default), "
                                             "sample-100BT, CC-MAIN-2024-10.")
@click.option("--text-field", default=None, help="Field/column with the text [dataset's: text].")
@click.option("--tokenizer", default="gpt2", show_default=True,
              help="tiktoken name (gpt2, r50k_base, cl100k_base, o200k_base), a .tiktoken ranks "
                   "file, or a Hugging Face tokenizer.json.")
@click.option("--tokenizer-engine", type=click.Choice(TOKENIZER_ENGINES), default="auto",
              show_default=True, help="What encodes: fast (fastokens), reference (tiktoken / "
              "tokenizers) or auto (fast where it loads and agrees). The output is the same.")
@click.option("--seq", type=int, default=32768, show_default=True, help="Tokens per row.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="mds", show_default=True)
@click.option("--workers", type=int, default=os.cpu_count() or 1, show_default="all cores",
              help="Tokenizer threads (the output does not depend on it).")
@click.option("--val-fraction", type=float, default=0.0005, show_default=True,
              help="Fraction of documents (by stable hash) in the validation split.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the split.")
@click.option("--max-tokens", type=int, default=None,
              help="Stop after the document at which the token count reaches N.")
@click.option("--limit-docs", type=int, default=None, help="Stop after N documents.")
@click.option("--compression", default=None,
              help="zstd, zstd:LEVEL or none [mds: zstd; memmap: none].")
@click.option("--on-error", type=click.Choice(["skip", "fail"]), default="skip",
              show_default=True, help="Bad input: count and log it, or stop.")
@click.option("--bos/--no-bos", default=False, show_default=True,
              help="Start every document with the tokenizer's BOS token.")
@click.option("--last-row", type=click.Choice(LAST_ROW_POLICIES), default="pad",
              show_default=True, help="Final partial row of each split: pad it or drop it.")
@click.option("--shard-bytes", type=int, default=SHARD_BYTES, show_default=True,
              help="Token bytes per shard.")
@click.option("--overwrite", is_flag=True, help="Replace an existing build in --out.")
@click.option("--quiet", is_flag=True, help="No progress bar and no summary. Re-running a "
              "finished build does nothing and exits 0; without --quiet it says so.")
def build(dataset, inputs, subset, text_field, tokenizer, tokenizer_engine, seq, out, fmt, workers,
          val_fraction, seed, max_tokens, limit_docs, compression, on_error, bos, last_row,
          shard_bytes, overwrite, quiet):
    """Tokenize documents and pack them into rows of exactly --seq tokens."""
    from pipeline.build import Build
    from pipeline.manifest import already_complete, summary

    try:
        cfg = BuildConfig(out=out, dataset=dataset, inputs=tuple(inputs), subset=subset,
                          text_field=text_field, tokenizer=tokenizer,
                          tokenizer_engine=tokenizer_engine, seq=seq, format=fmt,
                          workers=workers, val_fraction=val_fraction, seed=seed,
                          max_tokens=max_tokens, limit_docs=limit_docs, compression=compression,
                          on_error=on_error, bos=bos, last_row=last_row,
                          shard_bytes=shard_bytes, overwrite=overwrite)
        builder = Build(cfg, show_progress=False if quiet else None)
        manifest = builder.run()
    except LongpackError as e:
        raise click.ClickException(str(e)) from None
    if not quiet:
        if builder.already_complete:
            click.echo(already_complete(manifest, Path(out)))
        click.echo(summary(manifest, Path(out)))




@pack.command()
@click.argument("path", type=click.Path(path_type=Path))
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
def stats(path, verify, as_json, decode, split, plot, throughput, budget, eos_id):
    """Validate a build and report what it holds and what it will train."""
    import json

    from pipeline import stats_report

    try:
        if decode is not None:
            click.echo(stats_report.decode_row(path, split, decode, eos_id))
            return
        report = stats_report.collect(path, verify, throughput, budget, eos_id)
        if plot is not None:
            stats_report.plot(report, plot)
    except LongpackError as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(report, indent=2) if as_json else stats_report.render(report))
    if not report["checks"]["ok"]:
        sys.exit(1)
