"""`zoo`: the model zoo's command line, next to `pack` and `train`.

    zoo list [--vocab V] [--json]           the presets: total and active parameters, FLOPs/token
    zoo export RUN [--step N] --to hf --out DIR          GPT-NeoX -> a transformers directory
    zoo export RUN --to safetensors --out DIR            any family -> what archs.load(DIR) reads

`python -m archs` and `train --list-models` print the same table (archs/__main__.py's).
"""

import json
from pathlib import Path

import click

EXPORTS = ("hf", "safetensors")


@click.group()
@click.version_option(package_name="longpack")
def zoo():
    """longpack's model zoo: list the presets, export a trained run."""


@zoo.command("list")
@click.option("--vocab", type=click.IntRange(min=1), default=None, metavar="V",
              help="Sizes at this vocabulary (a build's tokenizer vocab_size) [each preset's own].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (what archs/presets.json holds).")
def list_presets(vocab, as_json):
    """The presets with their true parameter counts and FLOPs/token."""
    import archs
    from archs.__main__ import table

    models = archs.list_models(vocab_size=vocab)
    click.echo(json.dumps(models, indent=2) if as_json else table(models))


@zoo.command()
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--step", type=int, default=None, help="The checkpoint of this step [the newest].")
@click.option("--to", "to", type=click.Choice(EXPORTS), required=True,
              help="hf: a transformers GPTNeoXForCausalLM directory (GPT-NeoX); safetensors: "
              "config.json + model.safetensors that archs.load reads (any family).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Directory to write.")
def export(run, step, to, out):
    """Write a trained run's model for use outside longpack."""
    from pipeline import LongpackError

    try:
        import archs
        from training.export import export_hf, load_run

        if out.exists() and any(out.iterdir()):
            raise LongpackError(f"--out {out} is not empty: choose a new or empty directory")
        model, tokenizer = load_run(run, step)
        notes = export_hf(model, tokenizer, out) if to == "hf" else []
        if to == "safetensors":
            archs.save(model, out)
    except LongpackError as e:
        raise click.ClickException(str(e)) from None
    for note in notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"zoo export: {run} -> {out} ({to}, {model.num_params():,} parameters)")


if __name__ == "__main__":  # python -m training.zoo_cli
    zoo()
