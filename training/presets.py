"""The presets sized at a build's vocabulary: `train --list-models` and `zoo list` (the table is
archs/preset_table.py's)."""

from longpack import archs


def sized_presets(vocab_size: int | None) -> list[dict]:
    """Every preset's sizes at `vocab_size` (None: each one's own) from archs/presets.json,
    at once: they are linear in the vocabulary (tests/test_presets.py holds them to built
    models), where measuring every preset's FLOPs takes seconds each. Measured when the file
    lacks a preset."""
    from longpack.pipeline import at_vocab, preset_table

    if vocab_size is not None:
        archs.config(next(iter(archs.PRESETS)), vocab_size=vocab_size)  # its range, as a model's
    table = {p["name"]: p for p in preset_table()}
    if set(table) != set(archs.PRESETS):
        return archs.list_models(vocab_size=vocab_size)
    return [{**table[n], **at_vocab(table[n], vocab_size)} for n in archs.PRESETS]


def presets_of_build(shards: tuple[str, ...] | None, seq: int | None) -> str:
    """`train --list-models`: the presets sized at the vocabulary of --shards' build and
    FLOPs/token at its seq (or --seq); without --shards at each preset's own vocabulary, which
    the note says."""
    from longpack.pipeline import parse_mixture, read_manifest

    if not shards:
        return (archs.presets_table(sized_presets(None)) + "\n(each preset at its own "
                "vocabulary; with --shards OUT, at that build's)")
    shards = parse_mixture(shards, None, (), ())[0][0][1]  # a mixture's first: one tokenizer
    manifest = read_manifest(shards)
    vocab, seq = manifest["tokenizer"]["vocab_size"], seq or manifest["seq"]
    models = (sized_presets(vocab) if seq - 1 == archs.LIST_SEQ else
              archs.list_models(seq - 1, vocab_size=vocab, per_vocab=False))
    return (archs.presets_table(models) + f"\n(at the vocabulary of {shards}: {vocab:,}; "
            f"FLOPs/token at its {seq - 1} predictions per sample)")
