"""`pack stats A B --mix ...` (issue 18): each build's report, then the mixture's shares, tokens
before any source repeats, epochs per source for --budget and the compute-optimal size, every
figure computed here from the builds' manifests; the refusals and usage errors."""

import ast
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import small_build, write_byte_ranks
from longpack.pipeline.cli import pack
from longpack.pipeline.mixture import REPEAT_WARNING_EPOCHS
from longpack.pipeline.stats import mix as stats_mix
from longpack.pipeline.stats.recommend import TOKENS_PER_PARAM, recommendations
from longpack.pipeline.stats.report import collect, render

ROOT = Path(__file__).resolve().parent.parent



@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> dict[str, Path]:
    """web (200 documents) and code (30), one tokenizer and seq; `other` of another tokenizer,
    `longer` of longer rows."""
    folder = tmp_path_factory.mktemp("mix")
    gpt2 = str(write_byte_ranks(folder / "gpt2.tiktoken"))
    cl100k = str(write_byte_ranks(folder / "cl100k_base.tiktoken"))
    return {"web": small_build(folder, gpt2, "web", 200, seed=1),
            "code": small_build(folder, gpt2, "code", 30, seed=2),
            "other": small_build(folder, cl100k, "other", 30, seed=3),
            "longer": small_build(folder, gpt2, "longer", 30, seed=4, seq=129)}


def train_split(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())["splits"]["train"]


def stats(*args):
    result = CliRunner().invoke(pack, ["stats", *map(str, args)])
    return result.exit_code, result.output


@pytest.mark.slow
def test_mix_gives_shares_tokens_before_repeat_epochs_and_the_warning(builds):
    web, code = train_split(builds["web"])["tokens"], train_split(builds["code"])["tokens"]
    shares = {"web": 0.7, "code": 0.3}
    before = {"web": web / 0.7, "code": code / 0.3}
    first = min(before, key=before.get)
    budget = (REPEAT_WARNING_EPOCHS + 1) * code / 0.3  # code: 5 epochs, web: under 4
    assert 0.7 * budget / web < REPEAT_WARNING_EPOCHS
    code_, out = stats(f"web={builds['web']}", f"code={builds['code']}",
                       "--mix", "web=7,code=3", "--budget", budget, "--json")
    assert code_ == 0, out
    r = json.loads(out)
    assert list(r) == ["builds", "mixture"] and list(r["builds"]) == ["web", "code"]
    assert r["builds"]["code"]["recommendations"]["train_tokens"] == code
    m = r["mixture"]
    assert set(m) == {"sources", "shares_from", "tokens_before_repeat", "first_to_repeat",
                      "repeat_warning_epochs", "repeated", "recommendations"}
    assert m["shares_from"] == "--mix" and m["first_to_repeat"] == first
    assert m["tokens_before_repeat"] == pytest.approx(before[first], abs=1)
    for s in m["sources"]:
        assert set(s) == {"name", "path", "train_rows", "train_tokens", "share",
                          "budget_tokens", "epochs"}
        tokens = {"web": web, "code": code}[s["name"]]
        assert s["path"] == str(builds[s["name"]])
        assert s["train_tokens"] == tokens
        assert s["train_rows"] == train_split(builds[s["name"]])["rows"]
        assert s["share"] == pytest.approx(shares[s["name"]])
        assert s["budget_tokens"] == pytest.approx(shares[s["name"]] * budget)
        assert s["epochs"] == pytest.approx(shares[s["name"]] * budget / tokens)
    assert m["repeated"] == ["code"] and m["repeat_warning_epochs"] == REPEAT_WARNING_EPOCHS
    rec = m["recommendations"]
    vocab = json.loads((builds["web"] / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    assert rec["train_tokens"] == m["tokens_before_repeat"]
    assert rec["compute_optimal_params"] == pytest.approx(m["tokens_before_repeat"]
                                                          / TOKENS_PER_PARAM)
    assert rec["vocab_size"] == vocab
    assert rec["presets"] == recommendations(m["tokens_before_repeat"], None, None,
                                             vocab)["presets"]
    assert rec["epochs_for_budget"] == pytest.approx(budget / m["tokens_before_repeat"])

    code_, text = stats(f"web={builds['web']}", f"code={builds['code']}",
                        "--mix", "web=7,code=3", "--budget", budget)
    assert code_ == 0
    assert text.startswith(render(collect(builds["web"], budget=budget)) + "\n\n")
    assert f"{m['tokens_before_repeat']:,} tokens before any source repeats ({first} runs " \
           "out first)" in text
    warnings = [line for line in text.splitlines() if line.startswith("  warning")]
    assert len(warnings) == 1 and "code is repeated 5.0 times" in warnings[0]
    assert f"past about {REPEAT_WARNING_EPOCHS} epochs" in warnings[0]


def test_without_mix_each_source_is_in_proportion_to_its_train_rows(builds):
    code_, out = stats(builds["web"], builds["code"], "--json")
    assert code_ == 0, out
    m = json.loads(out)["mixture"]
    rows = {n: train_split(builds[n])["rows"] for n in ("web", "code")}
    tokens = {n: train_split(builds[n])["tokens"] for n in ("web", "code")}
    assert m["shares_from"] == "train rows" and m["repeated"] == []
    for s in m["sources"]:
        assert s["share"] == pytest.approx(rows[s["name"]] / sum(rows.values()))
        assert "epochs" not in s and "budget_tokens" not in s
    before = min(tokens[n] / s["share"] for n, s in zip(tokens, m["sources"]))
    assert m["tokens_before_repeat"] == pytest.approx(before, abs=1)
    # in proportion to size: about all the tokens before any repeats (rows hold some padding)
    assert m["tokens_before_repeat"] <= sum(tokens.values())
    assert m["tokens_before_repeat"] > 0.99 * sum(tokens.values())
    _, text = stats(builds["web"], builds["code"])
    assert "shares from in proportion to train rows" in text


def test_builds_of_other_tokenizers_or_row_lengths_are_refused_before_any_shard_is_read(
        builds, monkeypatch):
    monkeypatch.setattr(stats_mix, "collect", lambda *a, **k: pytest.fail("a build was read"))
    code_, out = stats(builds["web"], builds["other"])
    assert code_ == 1
    sha = json.loads((builds["web"] / "manifest.json").read_text())["tokenizer"]["sha256"][:12]
    # the test's byte ranks files are not the real ones: named by stem and hash (issue 44)
    assert out.strip() == (f"Error: pack stats: web and other were tokenized differently: "
                           f"gpt2-{sha[:8]} (sha256 {sha}, vocabulary 50,257) vs "
                           f"cl100k_base-{sha[:8]} (sha256 {sha}, vocabulary 100,277); a mixture "
                           "needs one tokenizer: rebuild one of them")
    code_, out = stats(builds["web"], builds["longer"], "--mix", "web=1,longer=1")
    assert code_ == 1 and len(out.strip().splitlines()) == 1
    assert "pack stats: web has rows of 65 tokens and longer of 129" in out


@pytest.mark.parametrize("args, message", [
    (["{web}", "--mix", "web=1"], "--mix needs two or more builds: pack stats web=./fw "
                                  "code=./code --mix web=0.7,code=0.3"),
    (["{web}", "{code}", "--decode", "0"], "--decode reads one build: give one PATH"),
    (["{web}", "{code}", "--plot", "x.png"], "--plot reads one build: give one PATH"),
    (["{web}", "{code}", "--mix", "web=1,cod=1"], "--mix: no source is named 'cod'; the "
                                                  "sources: web, code"),
    (["{web}", "{code}", "--mix", "web=0.7"], None),  # code: weight 0, allowed
    (["{web}", "{web}"], "pack stats: two sources are named 'web'; name them: pack stats "
                         "NAME=PATH"),
])
def test_usage_errors_are_one_line(builds, args, message):
    code_, out = stats(*(a.format(**builds) for a in args))
    if message is None:
        assert code_ == 0, out
        return
    assert code_ == 2
    assert out.strip().splitlines()[-1] == f"Error: {message}"


def test_one_path_prints_the_single_build_report_as_before(builds):
    code_, text = stats(builds["web"], "--budget", 1e6)
    assert code_ == 0
    assert text == render(collect(builds["web"], budget=1e6)) + "\n"
    _, out = stats(builds["web"], "--json")
    assert json.loads(out) == collect(builds["web"])


def test_a_build_failing_its_checks_fails_the_mixture_which_is_still_reported(
        builds, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(builds["code"], broken)
    shard = sorted((broken / "train").glob("shard.*"))[0]
    shard.write_bytes(shard.read_bytes()[:-5])
    code_, text = stats(builds["web"], broken)
    assert code_ == 1
    assert "PROBLEMS" in text and "tokens before any source repeats" in text


def test_the_repeat_warning_is_defined_once():
    defined = [path.relative_to(ROOT).as_posix()
               for package in ("longpack", "pipeline", "training")
               for path in (ROOT / package).rglob("*.py")
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Assign)
               and any(getattr(t, "id", None) == "REPEAT_WARNING_EPOCHS" for t in node.targets)]
    assert defined == ["pipeline/mixture.py"]
