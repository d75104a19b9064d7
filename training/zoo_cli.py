"""`zoo`: the model zoo's command line, next to `pack` and `train`.

    zoo list [--vocab V] [--json]           the presets: total and active parameters, FLOPs/token
    zoo export RUN [--step N] --to hf --out DIR          GPT-NeoX -> a transformers directory
    zoo export RUN --to safetensors --out DIR            any family -> what archs.load(DIR) reads
    zoo eval RUN --shards BUILD [--split val] [--json]   loss, perplexity, bits per byte
    zoo generate RUN --prompt TEXT [--max-new-tokens N] [--temperature T --top-k K --top-p P]

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


@zoo.command("eval")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--shards", required=True, help="A build (its --out, or URL) with the run's "
              "tokenizer.")
@click.option("--split", default="val", show_default=True, help="train or val.")
@click.option("--step", type=int, default=None, help="The checkpoint of this step [the newest].")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="Only the first N rows of the split [all].")
@click.option("--cache", type=click.Path(path_type=Path), default=None,
              help="Shard cache for an MDS build [a temporary folder].")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def evaluate(run, shards, split, step, batch_size, limit, cache, as_json):
    """A run's model on a build's split: token-weighted loss, perplexity and bits per byte."""
    import math
    import tempfile

    from pipeline import LongpackError
    from training.data import open_build
    from training.evaluate import bits_per_byte, split_loss
    from training.export import load_run

    try:
        model, _ = load_run(run, step)
        with tempfile.TemporaryDirectory(prefix="longpack-eval.") as tmp:
            build = open_build(shards, cache or Path(tmp), "100gb")
            rows = build.train if split == "train" else build.val
            if split not in ("train", "val") or rows is None:
                raise LongpackError(f"--split {split}: {shards} has no such split with rows")
            if build.manifest["tokenizer"]["vocab_size"] > model.cfg.vocab_size:
                raise LongpackError(f"{shards} has a vocabulary of "
                                    f"{build.manifest['tokenizer']['vocab_size']:,} ids, the "
                                    f"model {model.cfg.vocab_size:,}: evaluate on a build of the "
                                    "run's tokenizer")
            n = min(len(rows), limit or len(rows))
            loss_sum, targets = split_loss(model, rows, n, batch_size)
    except LongpackError as e:
        raise click.ClickException(str(e)) from None
    loss = loss_sum / targets if targets else float("nan")
    counts = build.manifest["splits"][split]
    result = {"run": str(run), "shards": shards, "split": split, "rows": n, "targets": targets,
              "loss": loss, "perplexity": math.exp(min(loss, 50.0)),
              "bits_per_byte": bits_per_byte(loss, counts) if n == len(rows) else None}
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    bpb = result["bits_per_byte"]
    click.echo(f"zoo eval: {run} on {shards} {split} ({n:,} rows, {targets:,} targets): loss "
               f"{loss:.4f}, perplexity {result['perplexity']:.2f}, bits per byte "
               + ("-" if bpb is None else f"{bpb:.4f}"))


@zoo.command()
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--prompt", required=True, help="Text to continue (encoded with the build's "
              "tokenizer).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="0: greedy.")
@click.option("--top-k", type=click.IntRange(min=1), default=None)
@click.option("--top-p", type=click.FloatRange(min=0, max=1, min_open=True), default=None)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--step", type=int, default=None, help="The checkpoint of this step [the newest].")
def generate(run, prompt, max_new_tokens, temperature, top_k, top_p, seed, step):
    """Continue a prompt with a trained run's model; prints the prompt and its continuation."""
    import torch

    from pipeline import LongpackError
    from training.export import load_run
    from training.generate import generate as continue_ids

    try:
        model, tokenizer = load_run(run, step)
        if tokenizer is None:
            raise LongpackError(f"{run}: the build's tokenizer cannot be loaded here (its "
                                "manifest or tokenizer file is missing): nothing to encode the "
                                "prompt with")
        ids, _ = tokenizer.reference.encode_flat([prompt])
        allowed = torch.from_numpy(tokenizer.decodable())
        new = continue_ids(model, ids.tolist(), max_new_tokens, temperature, top_k, top_p, seed,
                           tokenizer.eos_id, allowed)
    except LongpackError as e:
        raise click.ClickException(str(e)) from None
    click.echo(prompt + tokenizer.decode(new))


if __name__ == "__main__":  # python -m training.zoo_cli
    zoo()
