"""Preset sizes at the vocabulary a build trains with: archs.list_models, `python -m longpack.archs`,
and the torch-free formula `pack stats` applies to archs/presets.json."""

import json
import subprocess
import sys

import pytest

from longpack.pipeline.stats.recommend import at_vocab, preset_table, recommendations

torch = pytest.importorskip("torch")
from longpack import archs  # noqa: E402  (after the skip: archs imports torch)
from longpack.archs.preset_table import gflops, presets_table  # noqa: E402

VOCABS = (256, 100_277)  # bytes; cl100k_base (neither a preset's own vocabulary)


def built_sizes(name: str, vocab_size: int) -> dict:
    model = archs.build(name, device="meta", vocab_size=vocab_size)
    params = model.num_params()
    active = model.active_params() if hasattr(model, "active_params") else params
    return {"params": params, "active_params": active,
            "flops_per_token": model.flops_per_token(archs.LIST_SEQ)}


@pytest.mark.slow  # each builds and measures every preset on the meta device
@pytest.mark.parametrize("vocab_size", VOCABS)
def test_presets_json_gives_every_presets_true_size_at_any_vocabulary(vocab_size):
    table_ = preset_table()
    assert [p["name"] for p in table_] == list(archs.PRESETS)
    for preset in table_:
        got, want = at_vocab(preset, vocab_size), built_sizes(preset["name"], vocab_size)
        assert got["vocab_size"] == vocab_size
        assert (got["params"], got["active_params"]) == (want["params"], want["active_params"])
        assert got["flops_per_token"] == pytest.approx(want["flops_per_token"], rel=1e-12)


@pytest.fixture(scope="module")
def own_models() -> list[dict]:
    """What `zoo list` shows: presets.json's sizes (held to measured ones by the slow tests)."""
    from longpack.training.presets import sized_presets

    return sized_presets(None)


def test_tiny_presets_are_sized_at_their_own_512_and_others_at_gpt2s_vocabulary(own_models):
    own = {m["name"]: m for m in own_models}
    assert {n: m["vocab_size"] for n, m in own.items() if n.endswith("-tiny")} == {
        "neox-tiny": 512, "moe-tiny": 512, "resonance-tiny": 512, "mamba-tiny": 512,
        "hybrid-tiny": 512}
    assert all(m["vocab_size"] == 50257 for n, m in own.items() if not n.endswith("-tiny"))
    from longpack.training.presets import sized_presets

    at_gpt2 = {m["name"]: m for m in sized_presets(50257)}
    assert at_gpt2["neox-tiny"]["params"] == built_sizes("neox-tiny", 50257)["params"] == 6_532_992
    assert at_gpt2["neox-1.2b"] == own["neox-1.2b"]


def test_stats_recommends_presets_at_the_builds_vocabulary():
    tiny_at_gpt2 = built_sizes("neox-tiny", 50257)["params"]
    rec = recommendations(20 * tiny_at_gpt2, None, None, vocab_size=50257)
    picked = {p["name"]: p for p in rec["presets"]}
    assert rec["vocab_size"] == 50257 and picked["neox-tiny"]["params"] == tiny_at_gpt2
    assert all(p["vocab_size"] == 50257 for p in rec["presets"])
    # the tiny preset's own-vocabulary size (166k) is 40x smaller: not near 6.5M parameters
    small = recommendations(20 * 165_632, None, None, vocab_size=50257)["presets"]
    assert "neox-tiny" not in [p["name"] for p in small]


@pytest.mark.slow
def test_archs_main_vocab_prints_the_sizes_at_that_vocabulary(capsys):
    from longpack.archs.__main__ import main

    main(["--vocab", "100277", "--json"])
    models = archs.list_models(vocab_size=100277)
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(models))
    tiny = built_sizes("neox-tiny", 100277)
    row = next(line for line in presets_table(models).splitlines() if line.startswith("neox-tiny "))
    assert row.split() == ["neox-tiny", "gpt-neox", "100,277", f"{tiny['params']:,}",
                           f"{tiny['params']:,}", gflops(tiny["flops_per_token"])]
    for bad, says in (("0", "--vocab: 0 is not a vocabulary size"),
                      ("x", "--vocab: 'x' is not a whole number")):
        with pytest.raises(SystemExit) as exit_:
            main(["--vocab", bad])
        assert exit_.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.slow
def test_python_m_archs_reads_its_flags():
    """`python -m longpack.archs` passes its own argv to main (runpy from `train --list-models` not)."""
    out = subprocess.run([sys.executable, "-m", "longpack.archs", "--vocab", "300"], capture_output=True,
                         text=True, check=True).stdout
    assert out == presets_table(archs.list_models(vocab_size=300)) + "\n"


@pytest.mark.parametrize("flops,shown", [(4_139_520, "0.00414"), (9_694_691_328, "9.69"),
                                         (707_000_000, "0.707"), (30_320_000_000, "30.32"),
                                         (1_070_000, "0.00107"), (0, "0.00")])
def test_gflops_keep_three_significant_digits(flops, shown):
    assert gflops(flops) == shown


def test_the_table_shows_tiny_presets_flops_not_zero(own_models):
    text = presets_table(own_models)
    tiny = next(line for line in text.splitlines() if line.startswith("neox-tiny "))
    flops = next(m for m in own_models if m["name"] == "neox-tiny")["flops_per_token"]
    assert 1e6 < flops < 1e7 and tiny.split()[-1] == gflops(flops) != "0.00"
    assert "vocab" in text.splitlines()[0]
