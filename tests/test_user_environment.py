"""The user's environment works: after the README's install, a Python process that imports nothing
of longpack (so none of pipeline/formats/streaming_compat.py's or archs/hf/transformers_compat.py's
work-arounds) imports mosaicml-streaming, and loads and runs an exported GPT-NeoX with plain
transformers, `from_pretrained` and `pipeline("text-generation")`.

Both failed with "operator torchvision::nms does not exist" when the install put PyPI's (CUDA)
torchvision beside a CPU-only torch: streaming imports torchvision, and so does transformers
whenever it is installed."""

import ast
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from test_train import config

from longpack.training.loop import train
from longpack.zoo.cli import zoo

NOTHING_OF_LONGPACK = (
    "\nleaked = sorted({m.split('.')[0] for m in sys.modules} & {'longpack', 'pipeline', 'training',"
    " 'archs'})"
    "\nassert not leaked, leaked")


def plain_python(code: str, cwd) -> str:
    """`python -c CODE` in this environment, outside the repository (nothing of it on sys.path
    but the installed package), offline; its stdout."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", code + NOTHING_OF_LONGPACK], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_streaming_imports_with_torchvision(tmp_path):
    out = plain_python("import sys, streaming, torchvision\n"
                       "from streaming import MDSWriter, StreamingDataset\n"
                       "from streaming.vision import StreamingCIFAR10\n"
                       "print(streaming.__version__)", tmp_path)
    assert out.strip()


@pytest.mark.slow  # ~8 s: a tiny run, its export, and a process importing torch + transformers
def test_an_exported_gpt_neox_loads_and_generates_with_plain_transformers(tmp_path, shards):
    run, out = tmp_path / "run", tmp_path / "hf"
    train(config(shards, run, max_steps=2, save_every=2, workers=0), log=lambda m: None)
    result = CliRunner().invoke(zoo, ["export", str(run), "--to", "hf", "--out", str(out)])
    assert result.exit_code == 0, result.output
    code = f"""
import sys
from transformers import AutoModelForCausalLM, pipeline
model = AutoModelForCausalLM.from_pretrained({str(out)!r})
print(type(model).__name__)
generate = pipeline("text-generation", model={str(out)!r})
reply = generate("alpha beta", max_new_tokens=8, do_sample=False, return_tensors=True)
new = reply[0]["generated_token_ids"][len(generate.tokenizer("alpha beta")["input_ids"]):]
print(len(new))
print(repr(generate("alpha beta", max_new_tokens=8, do_sample=False)[0]["generated_text"]))
"""
    name, new_tokens, text = plain_python(code, tmp_path).strip().splitlines()[-3:]
    assert name == "GPTNeoXForCausalLM"
    assert int(new_tokens) > 0
    text = ast.literal_eval(text)  # the repr of a str
    assert isinstance(text, str) and text.startswith("alpha beta"), text
