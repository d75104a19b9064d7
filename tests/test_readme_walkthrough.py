"""README.md's walk-through, run as written: its ```bash blocks, read out of the README, in an
empty folder with no ../shared beside it, tiktoken's downloads failing (as offline) and the
virtualenv's console scripts on PATH; each output block under a command is what it prints, but
for what varies by machine (losses, rates, times, compressed sizes). The README and this test
cannot drift apart: a command that breaks, or prints other counts, fails here. The samples the
walk-through reads are checked against their README's sha256s (pipeline/samples/README.md)."""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from longpack.pipeline.read.catalog import DATASETS, SAMPLES
from longpack.pipeline.read.inputs import expand_inputs, open_inputs

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
# lines of an output block that differ by machine, not compared
VOLATILE = re.compile(r"tok/s|tokens/s|\bloss\b|^\s*time\b|ETA|bytes on disk|compression ratio|"
                      r"bytes per token")
SIZE = re.compile(r"[\d,.]+ ?(?:bytes|[kMG]?B)\b")  # a compressed size: zstd's version may vary
GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def section(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end > 0 else len(text)]


def commands(heading: str) -> list[tuple[str, str | None]]:
    """(the bash block, the output block right under it or None), in the README's order."""
    text = section(heading)
    blocks = [(m.group(1), m.group(2), m.start(), m.end()) for m in BLOCK.finditer(text)]
    found = []
    for i, (lang, body, _, end) in enumerate(blocks):
        if lang != "bash":
            continue
        follows = i + 1 < len(blocks) and blocks[i + 1][0] == "" and blocks[i + 1][2] == end
        found.append((body, blocks[i + 1][1] if follows else None))
    return found


def offline_env(tmp: Path) -> dict:
    """The console scripts of this interpreter's virtualenv first on PATH; tiktoken's cache
    empty and every HTTP(S) request sent to a closed port: a machine without the network."""
    env = dict(os.environ)
    for key in ("NO_PROXY", "no_proxy", "TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        env.pop(key, None)
    closed = "http://127.0.0.1:9"
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               TIKTOKEN_CACHE_DIR=str(tmp / ".no-tiktoken-cache"), HTTP_PROXY=closed,
               HTTPS_PROXY=closed, http_proxy=closed, https_proxy=closed, HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def shown_lines(command: str, output: str) -> list[str]:
    """The lines of a README output block that every machine prints the same, sizes masked
    (not the text a model generates from the command's --prompt either)."""
    prompts = tuple(re.findall(r'--prompt "([^"]+)"', command))
    return [SIZE.sub("SIZE", line.rstrip()) for line in output.splitlines()
            if line.strip() and line.strip() != "..." and not VOLATILE.search(line)
            and not (prompts and line.startswith(prompts))]


def test_the_walkthrough_is_read_out_of_the_readme():
    found = commands("Walk-through")
    assert [c.split()[0:2] for c, _ in found] == [
        ["pack", "build"], ["pack", "stats"], ["train", "--shards"], ["zoo", "export"],
        ["zoo", "generate"]]
    assert all(out for _, out in found)  # each command shows what it prints
    assert "../shared" not in section("Walk-through")
    assert "--dataset fineweb-edu-sample" in found[0][0]


def test_the_shipped_samples_are_those_their_readme_lists():
    listed = dict(re.findall(r"^\| `([^`]+)` \|.*\| `([0-9a-f]{64})` \|$",
                             (SAMPLES / "README.md").read_text(), re.M))
    shipped = {str(p.relative_to(SAMPLES)) for p in SAMPLES.rglob("*")
               if p.is_file() and p.name != "README.md" and "__pycache__" not in p.parts}
    assert set(listed) == shipped
    for name, sha in listed.items():
        assert hashlib.sha256((SAMPLES / name).read_bytes()).hexdigest() == sha, name
    assert listed["gpt2.tiktoken"] == GPT2_SHA256  # the offline stand-in for tiktoken's gpt2
    assert sum((SAMPLES / n).stat().st_size for n in listed) < 4_000_000


@pytest.mark.parametrize("name, files", [("fineweb-edu-sample", 2), ("dolma-sample", 4)])
def test_a_sample_dataset_reads_the_shipped_files_without_input(tmp_path, name, files):
    class Cfg:
        inputs, out, subset = (), str(tmp_path / "out"), None

    got, described = open_inputs(Cfg, DATASETS[name])
    assert [str(p) for p in got.paths] == [
        str(p) for p in expand_inputs(DATASETS[name], [str(SAMPLES / name)])]
    assert len(got.paths) == files and all(SAMPLES in p.parents for p in got.paths)


@pytest.mark.slow
def test_the_readme_walkthrough_runs_offline_as_written(tmp_path):
    """About a minute on 2 cores (the training run, and torch's start in each zoo command)."""
    work = tmp_path / "clone"
    work.mkdir()
    assert not (work.parent / "shared").exists()
    env = offline_env(tmp_path)
    for command, output in commands("Walk-through"):
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=work, env=env,
                           capture_output=True, text=True, timeout=600)
        printed = r.stdout + r.stderr
        assert r.returncode == 0, f"$ {command}\n{printed[-5000:]}"
        got = {SIZE.sub("SIZE", line.rstrip()) for line in printed.splitlines()}
        missing = [line for line in shown_lines(command, output or "") if line not in got]
        assert not missing, f"$ {command}\nthe README shows {missing}\nit printed:\n{printed}"
    manifest = json.loads((work / "fwe" / "manifest.json").read_text())
    assert manifest["tokenizer"]["sha256"] == GPT2_SHA256
    assert sorted(p.name for p in (work / "runs" / "tiny").glob("step-*"))
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (work / "tiny-hf" / name).is_file(), name


@pytest.mark.slow
def test_the_readme_python_example_runs_as_written(tmp_path):
    """The "From Python" block, run as a script in an empty folder, offline."""
    (block,) = [m.group(2) for m in BLOCK.finditer(section("From Python"))
                if m.group(1) == "python"]
    assert "../shared" not in block
    script = tmp_path / "example.py"
    script.write_text(block)
    work = tmp_path / "clone"
    work.mkdir()
    r = subprocess.run([sys.executable, str(script)], cwd=work, env=offline_env(tmp_path),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-5000:]


@pytest.mark.slow
def test_the_shipped_samples_are_what_tools_make_samples_makes(shared):
    """Regenerated from ../shared, every shipped file and its README come out the same."""
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "make_samples.py"), "--check",
                        "--shared", str(shared)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
