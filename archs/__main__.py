"""python -m longpack.archs [--json] [--vocab N]: the zoo's presets with their true parameter counts and
FLOPs/token, at each preset's own vocabulary or at `--vocab N` (a build's tokenizer vocab_size:
the embedding and the head grow with it, so a tiny preset's size depends mostly on it).

`--json` prints the table that archs/presets.json holds for torch-free readers (`pack stats`
sizes presets at a build's vocabulary from it); a test keeps that file equal to this output.
The text form is preset_table.py's, which other command lines list the presets with.
"""

import argparse
import json
import sys

from longpack.archs import list_models
from longpack.archs.limits import VOCAB
from longpack.archs.preset_table import presets_table


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
    parser = argparse.ArgumentParser(prog="python -m longpack.archs", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true",
                        help="print JSON (what archs/presets.json holds)")
    parser.add_argument("--vocab", type=_vocab, default=None, metavar="N",
                        help="sizes at this vocabulary (a build's manifest tokenizer.vocab_size) "
                             "[each preset's own]")
    args = parser.parse_args(argv)
    models = list_models(vocab_size=args.vocab)
    print(json.dumps(models, indent=2) if args.json else presets_table(models))


if __name__ == "__main__":
    # `train --list-models` runs this module (runpy) under the trainer's own command line: only
    # `python -m longpack.archs`, whose argv[0] is this file, gives flags to read here.
    main(sys.argv[1:] if sys.argv[0] == __file__ else [])
