"""`pack stats web=./fw code=./code --mix web=0.7,code=0.3 [--budget TOKENS]`: what a mixture of
builds gives. Each build gets its own report (stats_report.collect), then the mixture's:

    share_k              --mix, or (as train draws without --mix) in proportion to train rows
    tokens before repeat min over sources with share_k > 0 of train_tokens_k / share_k
    with --budget B      source k gets share_k x B tokens, share_k x B / train_tokens_k epochs

and the compute-optimal size (recommend.py) for the tokens before any source repeats: past
that, some source is seen again, and past REPEAT_WARNING_EPOCHS of it its tokens are worth much
less than new ones. train_tokens_k are real tokens; train draws rows, so the real tokens'
shares differ from --mix by each build's padding (concat pads a split's last row, best-fit
any row's end).

Builds of other tokenizers or row lengths are refused, as train refuses them, from their
manifests before any shard is read, and once more from the reports (builds without a manifest).
"""

import json
from pathlib import Path

from longpack.core import DataError, LongpackError, Store, is_url
from longpack.pipeline.manifest import same_tokenizer, tokenizer_label
from longpack.pipeline.mixture import REPEAT_WARNING_EPOCHS, natural_weights
from longpack.pipeline.stats.files import open_output
from longpack.pipeline.stats.recommend import recommendations
from longpack.pipeline.stats.report import collect, human, human_duration, recommend_line


def collect_all(sources: list[tuple[str, str]], verify: bool, throughput, budget,
                eos_id) -> list[dict]:
    """Each build's report, as `pack stats PATH` collects it, once the builds are known to mix."""
    known = [(name, m) for name, m in ((n, _manifest(n, p)) for n, p in sources)
             if isinstance(m, dict) and isinstance(m.get("tokenizer"), dict)]
    same_tokens([n for n, _ in known], [m["tokenizer"] for _, m in known],
                [m.get("seq") for _, m in known])
    reports = []
    for name, path in sources:
        try:
            reports.append(collect(path, verify, throughput, budget, eos_id))
        except LongpackError as e:
            raise type(e)(f"{name}: {e}") from None
    same_tokens([n for n, _ in sources], [r["tokenizer"] for r in reports],
                [_train(r).get("seq") for r in reports])
    return reports


def _manifest(name: str, path: str) -> dict | None:
    """The build's manifest, read before its shards (None: none or unreadable here; its report
    says why)."""
    try:
        if is_url(path):
            store = Store(path)
            return json.loads(store.read_bytes("manifest.json")) if store.info(
                "manifest.json") else None
        return open_output(Path(path))[0]
    except ValueError:
        return None
    except LongpackError as e:
        raise type(e)(f"{name}: {e}") from None


def same_tokens(names: list[str], tokenizers: list[dict | None], seqs: list[int | None]) -> None:
    """Refuse builds whose ids mean other things (a tokenizer of None: no manifest) or whose
    rows differ in length (None: not known), naming both, in the trainer's words."""
    for name, tok, seq in zip(names[1:], tokenizers[1:], seqs[1:]):
        if not same_tokenizer(tok, tokenizers[0]):
            raise DataError(f"pack stats: {names[0]} and {name} were tokenized differently: "
                            f"{tokenizer_label(tokenizers[0])} vs {tokenizer_label(tok)};"
                            " a mixture needs one tokenizer: rebuild one of them")
        if seq is not None and seqs[0] is not None and seq != seqs[0]:
            raise DataError(f"pack stats: {names[0]} has rows of {seqs[0]} tokens and {name} of "
                            f"{seq}; a mixture needs one row length (train takes --seq a "
                            "divisor of both): rebuild one with pack build --seq")


def _train(report: dict) -> dict:
    """The split the report's recommendations count: train (or the only one, without a build)."""
    return report["splits"].get("train") or next(iter(report["splits"].values()), {})


def mixture(names: list[str], reports: list[dict], weights: dict | None, budget: float | None,
            throughput: float | None) -> dict:
    """The `mixture` section of the report (docs/STATS.md)."""
    tokens = {n: r["recommendations"]["train_tokens"] for n, r in zip(names, reports)}
    rows = {n: _train(r).get("rows", 0) for n, r in zip(names, reports)}
    if weights is None and not any(rows.values()):
        raise DataError("pack stats: no build has train rows: there is nothing to mix")
    shares = weights or natural_weights(rows)
    for n in names:
        if shares[n] > 0 and not tokens[n]:
            raise DataError(f"pack stats: {n} has no train tokens; give it a weight of 0 in "
                            "--mix or leave it out")
    lasts = {n: tokens[n] / shares[n] for n in names if shares[n] > 0}
    first = min(lasts, key=lasts.get)
    before = round(lasts[first])
    sources = []
    for n, r in zip(names, reports):
        s = {"name": n, "path": r["path"], "train_rows": rows[n], "train_tokens": tokens[n],
             "share": shares[n]}
        if budget:
            s["budget_tokens"] = shares[n] * budget
            s["epochs"] = shares[n] * budget / tokens[n] if tokens[n] else 0.0
        sources.append(s)
    return {"sources": sources, "shares_from": "--mix" if weights else "train rows",
            "tokens_before_repeat": before, "first_to_repeat": first,
            "repeat_warning_epochs": REPEAT_WARNING_EPOCHS,
            "repeated": [s["name"] for s in sources
                         if s.get("epochs", 0) > REPEAT_WARNING_EPOCHS],
            "recommendations": recommendations(before, throughput, budget,
                                               (reports[0]["tokenizer"] or {}).get("vocab_size"))}


def render(mix: dict) -> str:
    """The mixture's lines, below each build's report and aligned as they are."""
    with_budget = "epochs" in mix["sources"][0]
    head = ["share", "train tokens"] + (["budget tokens", "epochs"] if with_budget else [])
    cells = [[f"{100 * s['share']:.1f}%", f"{s['train_tokens']:,}"]
             + ([f"{s['budget_tokens']:,.0f}", f"{s['epochs']:.2f}"] if with_budget else [])
             for s in mix["sources"]]
    widths = [max(len(c) for c in column) + 2 for column in zip(head, *cells)]
    width = max(20, *(len(s["name"]) + 2 for s in mix["sources"]))
    how = ("--mix" if mix["shares_from"] == "--mix"
           else "in proportion to train rows (train's draw without --mix)")
    lines = ["  mixture".ljust(24) + f"shares from {how}",
             f"    {'':{width}}" + "".join(f"{h:>{w}}" for h, w in zip(head, widths)) + "  path"]
    for s, row in zip(mix["sources"], cells):
        lines.append(f"    {s['name']:{width}}" + "".join(f"{c:>{w}}" for c, w in zip(row, widths))
                     + f"  {s['path']}")
    lines.append(f"{'':24}{mix['tokens_before_repeat']:,} tokens before any source repeats "
                 f"({mix['first_to_repeat']} runs out first)")
    rec = mix["recommendations"]
    lines.append(recommend_line(rec, "tokens before any source repeats"))
    if "epoch_seconds" in rec:
        more = (f", the budget {human_duration(rec['budget_seconds'])}"
                if "budget_seconds" in rec else "")
        lines.append(f"{'':24}at {human(rec['throughput_tokens_per_second'])} tokens/s they "
                     f"take {human_duration(rec['epoch_seconds'])}{more}")
    for s in mix["sources"]:
        if s["name"] in mix["repeated"]:
            lines.append("  warning".ljust(24) + f"{s['name']} is repeated {s['epochs']:.1f} "
                         f"times: past about {mix['repeat_warning_epochs']} epochs repeated "
                         "tokens are worth much less than new ones; lower its weight or add data")
    return "\n".join(lines)
