"""What a build will train: the compute-optimal model size for its train tokens, the zoo's
presets near that size at the build's vocabulary, and epochs and time for a budget.

Preset sizes come from archs/presets.json (written by `python -m longpack.archs --json`), so `pack stats`
never imports torch. Each entry holds its sizes at its own vocabulary (`vocab_size`: 512 for the
tiny presets, 50,257 for the others) and what one more vocabulary entry adds (`per_vocab_entry`:
an embedding row and an untied head row). Every size is linear in the vocabulary, so `at_vocab`
gives a preset's size at the build's vocabulary exactly; a tiny preset is 166k parameters at 512
and 6.5M at GPT-2's 50,257, so sizing it at its own vocabulary would recommend it for data 40x
too small. tests/test_presets.py checks `at_vocab` against real builds of every preset.
"""

import importlib.util
import json
from pathlib import Path

TOKENS_PER_PARAM = 20  # compute-optimal training (Hoffmann et al. 2022, "Chinchilla")
SIZES = ("params", "active_params", "flops_per_token")


def preset_table() -> list[dict]:
    """archs/presets.json, found without importing archs (which imports torch); [] without it."""
    spec = importlib.util.find_spec("longpack.archs")
    table = Path(spec.submodule_search_locations[0]) / "presets.json" if spec else None
    if table is None or not table.exists():
        return []
    return json.loads(table.read_text())


def at_vocab(preset: dict, vocab_size: int | None) -> dict:
    """A presets.json entry's sizes at `vocab_size` (None: the preset's own vocabulary)."""
    vocab = preset["vocab_size"] if vocab_size is None else vocab_size
    more = vocab - preset["vocab_size"]
    sizes = {k: preset[k] + preset["per_vocab_entry"][k] * more for k in SIZES}
    return {"name": preset["name"], "family": preset["family"], "vocab_size": vocab, **sizes,
            "seq": preset["seq"]}


def recommendations(train_tokens: int, throughput: float | None, budget: float | None,
                    vocab_size: int | None = None) -> dict:
    """`presets`: those within 0.5x-2x of the compute-optimal size, sized at `vocab_size` (the
    build's tokenizer's; None, without a manifest: each preset at its own)."""
    params = train_tokens / TOKENS_PER_PARAM
    sized = [at_vocab(p, vocab_size) for p in preset_table()]
    out = {"train_tokens": train_tokens, "tokens_per_param": TOKENS_PER_PARAM,
           "compute_optimal_params": params, "vocab_size": vocab_size,
           "presets": [p for p in sized if 0.5 * params <= p["params"] <= 2 * params]}
    if budget:
        out["budget_tokens"] = budget
        out["epochs_for_budget"] = budget / train_tokens if train_tokens else None
    if throughput:
        out["throughput_tokens_per_second"] = throughput
        out["epoch_seconds"] = train_tokens / throughput
        if budget:
            out["budget_seconds"] = budget / throughput
    return out
