"""python -m archs [--json] [--vocab N]: the zoo's presets with their true parameter counts and
FLOPs/token, at each preset's own vocabulary or at `--vocab N` (a build's tokenizer vocab_size:
the embedding and the head grow with it, so a tiny preset's size depends mostly on it).

`--json` prints the table that archs/presets.json holds for torch-free readers (`pack stats`
sizes presets at a build's vocabulary from it); a test keeps that file equal to this output.
`table(models)` is the text form, for other command lines that list the presets.
"""

import argparse
import json
import math
import sys

from archs import LIST_SEQ, list_models
from archs.limits import VOCAB


def gflops(flops: float) -> str:
    """Three significant digits at least two decimals: 9.69, 0.00414 (not 0.00)."""
    g = flops / 1e9
    decimals = max(2, 2 - math.floor(math.log10(g))) if g > 0 else 2
    return f"{g:,.{decimals}f}"


def table(models: list[dict]) -> str:
    seq = models[0]["seq"] if models else LIST_SEQ
    lines = [f"{'name':<18}{'family':<11}{'vocab':>8}{'parameters':>15}{'active':>15}"
             f"{f'GFLOPs/token @{seq}':>21}"]
    for m in models:
        lines.append(f"{m['name']:<18}{m['family']:<11}{m['vocab_size']:>8,}{m['params']:>15,}"
                     f"{m['active_params']:>15,}{gflops(m['flops_per_token']):>21}")
    return "\n".join(lines)


def _vocab(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not VOCAB.holds(value):
        raise argparse.ArgumentTypeError(f"{value} is not a vocabulary size "
                                         f"({VOCAB.describe(whole=True)})")
    return value


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m archs", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true",
                        help="print JSON (what archs/presets.json holds)")
    parser.add_argument("--vocab", type=_vocab, default=None, metavar="N",
                        help="sizes at this vocabulary (a build's manifest tokenizer.vocab_size) "
                             "[each preset's own]")
    args = parser.parse_args(argv)
    models = list_models(vocab_size=args.vocab)
    print(json.dumps(models, indent=2) if args.json else table(models))


if __name__ == "__main__":
    # `train --list-models` runs this module (runpy) under the trainer's own command line: only
    # `python -m archs`, whose argv[0] is this file, gives flags to read here.
    main(sys.argv[1:] if sys.argv[0] == __file__ else [])
