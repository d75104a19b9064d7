"""`zoo`: the model zoo's command line, next to `pack` and `train`.

    zoo list [--vocab V] [--json]           the presets: total and active parameters, FLOPs/token
    zoo export RUN [--step N] --to hf --out DIR [--license ID --max-shard-size 5GB --no-tokenizer]
                                             every family -> a transformers / hub folder
    zoo export RUN --to safetensors --out DIR            any family -> what archs.load(DIR) reads
    zoo export RUN ... --shards BUILD        the run's build was moved: where it is now
    zoo eval RUN --shards BUILD [--split val] [--seq N] [--json]
                                             loss, perplexity, bits per byte
    zoo generate RUN --prompt TEXT [--max-new-tokens N] [--temperature T --top-k K --top-p P]

`python -m longpack.archs` and `train --list-models` print the same table (archs/preset_table.py's).
"""

import json
from pathlib import Path

import click

from longpack.core import Group, click_options
from longpack.zoo.settings import EvalConfig, ExportConfig, GenerateConfig, ListConfig


@click.group(cls=Group)
@click.version_option(package_name="longpack")
def zoo():
    """longpack's model zoo: list the presets, export a trained run."""


@zoo.command("list")
@click_options(ListConfig)
def list_presets(**settings):
    """The presets with their true parameter counts and FLOPs/token."""
    from longpack.archs import presets_table
    from longpack.training import sized_presets

    cfg = ListConfig(**settings)
    try:
        models = sized_presets(cfg.vocab)
    except ValueError as e:  # a vocabulary no model takes (archs/limits.py VOCAB)
        raise click.ClickException(f"--vocab {cfg.vocab}: {e}") from None
    click.echo(json.dumps(models, indent=2) if cfg.as_json else presets_table(models))


@zoo.command()
@click_options(ExportConfig)
def export(**settings):
    """Write a trained run's model for use outside longpack."""
    from longpack.zoo.runs import export_run

    cfg = ExportConfig(**settings)
    model, notes = export_run(cfg)
    for note in notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"zoo export: {cfg.run} -> {cfg.out} ({cfg.to}, {model.num_params():,} "
               "parameters)")


@zoo.command("eval")
@click_options(EvalConfig)
def evaluate(**settings):
    """A run's model on a build's split: token-weighted loss, perplexity and bits per byte,
    on samples of the run's --seq (or --seq)."""
    import math
    import tempfile

    from longpack.core import LongpackError
    from longpack.pipeline import open_build, read_manifest
    from longpack.training import bits_per_byte, split_loss
    from longpack.zoo.runs import load_run

    cfg = EvalConfig(**settings)
    run, shards, split, seq = Path(cfg.run), cfg.shards, cfg.split, cfg.seq
    trained = load_run(run, cfg.step)
    model = trained.model
    manifest = read_manifest(shards)
    check_eval_build(trained, manifest, shards, split)
    seq = seq or trained.seq  # None (a checkpoint before seq was kept): whole rows
    if seq is not None and manifest.get("seq") and manifest["seq"] % seq:
        raise LongpackError(f"--seq {seq}: the rows of {shards} are {manifest['seq']} "
                            "tokens, not a multiple of it (the run trained on samples of "
                            f"{trained.seq}); pass --seq with a divisor of "
                            f"{manifest['seq']}")
    with tempfile.TemporaryDirectory(prefix="longpack-eval.") as tmp:
        build = open_build(shards, Path(cfg.cache or tmp), "100gb", seq=seq, manifest=manifest)
        rows = build.train if split == "train" else build.val
        n = min(len(rows), cfg.limit or len(rows))
        loss_sum, targets = split_loss(model, rows, n, cfg.batch_size)
    loss = loss_sum / targets if targets else float("nan")
    counts = build.manifest["splits"][split]
    result = {"run": str(run), "shards": shards, "split": split, "seq": build.seq, "rows": n,
              "targets": targets,
              "loss": loss, "perplexity": math.exp(min(loss, 50.0)),
              "bits_per_byte": bits_per_byte(loss, counts) if n == len(rows) else None}
    if cfg.as_json:
        click.echo(json.dumps(result, indent=2))
        return
    bpb = result["bits_per_byte"]
    rows = "rows" if build.seq == manifest["seq"] else f"windows of {build.seq} tokens"
    click.echo(f"zoo eval: {run} on {shards} {split} ({n:,} {rows}, {targets:,} targets): loss "
               f"{loss:.4f}, perplexity {result['perplexity']:.2f}, bits per byte "
               + ("-" if bpb is None else f"{bpb:.4f}"))


def check_eval_build(trained, manifest: dict, shards: str, split: str) -> None:
    """Refuse, in one line, a build whose ids mean other things than the run's (another
    tokenizer, or a copy of another one in its folder), or that has no rows in `split`."""
    from longpack.core import LongpackError, is_url
    from longpack.pipeline import other_tokenizer

    theirs = manifest.get("tokenizer")
    other = other_tokenizer(trained.trained_on, theirs, None if is_url(shards) else Path(shards),
                            shards)
    if other:
        raise LongpackError(f"{other}: evaluate on a build of the run's tokenizer")
    vocab = (theirs or {}).get("vocab_size") or 0
    if vocab > trained.model.cfg.vocab_size:
        raise LongpackError(f"{shards} has a vocabulary of {vocab:,} ids, the model "
                            f"{trained.model.cfg.vocab_size:,}: evaluate on a build of the run's "
                            "tokenizer")
    if not manifest.get("splits", {}).get(split, {}).get("rows"):
        has = [s for s, c in manifest.get("splits", {}).items() if c.get("rows")]
        raise LongpackError(f"{shards} has no {split} rows (its splits with rows: "
                            f"{', '.join(has) or 'none'})" + (
                                f"; pass --split {has[0]}" if has else ""))


@zoo.command()
@click_options(GenerateConfig)
def generate(**settings):
    """Continue a prompt with a trained run's model; prints the prompt and its continuation as
    it is generated (Ctrl+C stops it, keeping what was printed). An empty prompt starts a new
    document (after the tokenizer's EOS)."""
    import torch

    from longpack.archs import TextStream, context, stream
    from longpack.core import LongpackError
    from longpack.zoo.runs import load_run

    cfg = GenerateConfig(**settings)
    run, prompt, max_new_tokens = Path(cfg.run), cfg.prompt, cfg.max_new_tokens
    trained = load_run(run, cfg.step, shards=cfg.shards)
    tokenizer = trained.tokenizer
    if trained.other_tokenizer:
        raise LongpackError(f"{run}: {trained.other_tokenizer}: the prompt's ids would not be "
                            "the ones the model learned; pass --shards with the run's build "
                            "where it is now")
    if tokenizer is None:
        raise LongpackError(f"{run}: no tokenizer to encode the prompt with: "
                            f"{trained.tokenizer_problem}. Put the build's tokenizer back (its "
                            "--out, or the file it names), or pass --shards with the build's "
                            "new place")
    try:
        ids = tokenizer.reference.encode_flat([prompt])[0].tolist()
    except UnicodeEncodeError as e:
        raise LongpackError(f"--prompt: not valid text ({e.reason} at character "
                            f"{e.start}); pass UTF-8 text") from None
    if not ids:  # nothing to continue: a new document, as after an EOS in training
        if tokenizer.eos_id is None:
            raise LongpackError("--prompt is empty and the build's tokenizer has no EOS to "
                                "start a document after: give some text to continue")
        ids = [tokenizer.eos_id]
    limit = context(trained.model, trained.seq)
    if limit is not None and len(ids) >= limit:
        raise LongpackError(f"--prompt is {len(ids):,} tokens, the model's context is "
                            f"{limit:,} (its max_seq or the rows it trained on): shorten it")
    if limit is not None and len(ids) + max_new_tokens > limit:
        click.echo(f"note: at most {limit - len(ids):,} new tokens: the model's context is "
                   f"{limit:,} tokens and the prompt takes {len(ids):,}", err=True)
        max_new_tokens = limit - len(ids)
    allowed = torch.from_numpy(tokenizer.decodable())
    tokens = stream(trained.model, ids, max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p,
                    cfg.seed, tokenizer.eos_id, allowed)
    text = TextStream(tokenizer.decode)
    click.echo(prompt, nl=False)
    count = 0
    try:
        for token in tokens:
            count += 1
            click.echo(text.add(token), nl=False)
    except KeyboardInterrupt:  # Ctrl+C: a clean stop, what was printed stays
        click.echo(text.flush())
        click.echo(f"zoo generate: stopped by Ctrl+C after {count:,} new tokens", err=True)
        return
    click.echo(text.flush())


if __name__ == "__main__":  # python -m longpack.zoo.cli
    zoo()
