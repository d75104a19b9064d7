"""lm-evaluation-harness on a `zoo export --to hf` folder: its Python API, a local task
(loglikelihood_rolling over a JSON lines file, offline) and `zoo eval` on the same documents
score the same tokens with the same contexts, so they agree to float rounding.

Why exact by construction: every document is "#" + 63 ASCII bytes, one token per byte (the
byte tokenizer), so with its EOS it is exactly one 65-token row, alone in it (doc_starts [0]).
zoo eval scores that row's 64 targets: bytes 2..64, each from the bytes before it (positions
from 0 at "#"), and the EOS. lm-eval's rolling loglikelihood scores every token of its text from
a prefix token: with prefix_token_id = "#" and the text minus its "#" plus a literal
<|endoftext|> (the exported tokenizer's EOS), it feeds the model the same 65 tokens at the same
positions and scores the same 64 targets (one window: the export's max length is far longer).

What differs is only the bits-per-byte arithmetic, both exactly known: zoo eval reports the mean
loss per target times the split's tokens per byte (65 tokens, 64 bytes a document), lm-eval the
summed loss over its text's bytes (63 + 13 for the literal <|endoftext|>). So the test compares
the summed nats that each figure stands for.

lm_eval[hf] is in the `test` extra, bounded so that pip resolves it at once: unbounded, pip
took lm_eval 0.4.13's newest datasets (5.1+: huggingface_hub >= 1.31, which transformers 4.x
refuses; transformers 4.x is what mosaicml-streaming allows) and backtracked for many minutes
over this project's dependencies. On transformers 5, besides, TikTokenConverter leaves the
exported tokenizer.json without its <|endoftext|> (encoded as id 256 here, the assertion below).
Resolved when this was written: lm_eval 0.4.13, datasets 4.8.5, huggingface_hub 0.36.2,
transformers 4.57.6, fsspec and s3fs 2026.2.0. Offline (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE),
about 15 s on CPU. Without lm_eval installed (an install without the extra) it skips, saying so."""

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from test_train import config

from conftest import write_jsonl
from longpack.archs.hf.transformers_compat import import_transformers
from longpack.pipeline.formats.shards import open_split
from longpack.training.loop import train
from longpack.zoo.cli import zoo

EOS_TEXT = "<|endoftext|>"


def documents(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    alphabet = np.array(list("abcdefgh ijklmnop qrstuvwxyz.,"))
    return ["#" + "".join(rng.choice(alphabet, size=63)) for _ in range(n)]


@pytest.mark.slow
def test_lm_eval_on_an_export_gives_zoo_evals_bits_per_byte(tmp_path, byte_tokenizer,
                                                           monkeypatch):
    lm_eval = pytest.importorskip(
        "lm_eval", reason='lm_eval is not installed (the test extra has it: pip install -e ".[test]")')
    pytest.importorskip("transformers")
    from lm_eval.tasks import TaskManager

    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(key, "1")  # a local task: nothing from the hub
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))

    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in documents(48)])
    shards = tmp_path / "mds"
    build(BuildConfig(out=str(shards), dataset="jsonl", inputs=(str(tmp_path / "d.jsonl"),),
                      tokenizer=byte_tokenizer, seq=65, val_fraction=0.25), show_progress=False)
    manifest = json.loads((shards / "manifest.json").read_text())
    eos = manifest["tokenizer"]["eos_id"]
    val = []  # the val split's documents, from its rows: one document a row, no padding
    for row, starts, _ in open_split(shards / "val").rows():
        row = np.asarray(row)
        assert list(starts) == [0] and len(row) == 65 and row[-1] == eos and row[0] == ord("#")
        val.append(bytes(row[:-1].astype(np.uint8)).decode())
    counts = manifest["splits"]["val"]
    assert len(val) >= 8 and counts["tokens"] == 65 * len(val)
    assert counts["text_bytes"] == 64 * len(val)

    run, hf = tmp_path / "run", tmp_path / "hf"
    train(config(shards, run, max_steps=2, save_every=2, workers=0), log=lambda m: None)
    runner = CliRunner()
    result = runner.invoke(zoo, ["export", str(run), "--to", "hf", "--out", str(hf)])
    assert result.exit_code == 0, result.output
    tokenizer = import_transformers().AutoTokenizer.from_pretrained(hf)
    assert tokenizer.encode(EOS_TEXT, add_special_tokens=False) == [eos], \
        "the exported tokenizer does not read a literal <|endoftext|> as its EOS"
    result = runner.invoke(zoo, ["eval", str(run), "--shards", str(shards), "--json"])
    assert result.exit_code == 0, result.output
    ours = json.loads(result.output)
    assert ours["targets"] == 64 * len(val)

    data = write_jsonl(tmp_path / "val.jsonl", [{"text": t[1:] + EOS_TEXT} for t in val])
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "longpack_val.yaml").write_text(f"""\
task: longpack_val
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: bits_per_byte
    aggregation: bits_per_byte
    higher_is_better: false
""")
    out = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={hf},dtype=float32,prefix_token_id={ord('#')}",
        tasks=["longpack_val"], task_manager=TaskManager(include_path=str(tasks)),
        batch_size=8, device="cpu")
    theirs = out["results"]["longpack_val"]["bits_per_byte,none"]

    # nats summed over the same 64 x len(val) targets, from each figure
    ours_nats = ours["bits_per_byte"] * math.log(2) * counts["text_bytes"] * ours["targets"] \
        / counts["tokens"]
    theirs_nats = theirs * math.log(2) * sum(len(t[1:] + EOS_TEXT) for t in val)
    assert theirs_nats == pytest.approx(ours_nats, rel=1e-6)
    assert ours_nats == pytest.approx(ours["loss"] * ours["targets"], rel=1e-9)
