"""The settings of one `pack stats`; its flags are these fields (longpack/settings.py). Loads
no numpy: `pack --help` reads it."""

from dataclasses import dataclass

from longpack.settings import setting


@dataclass(frozen=True, kw_only=True)
class StatsConfig:
    paths: tuple[str, ...] = setting(argument=True, multiple=True, metavar="PATH...")
    verify: bool = setting(False, "Also check checksums, token ids, document starts and "
                           "continued documents' hashes.", switch=True, show_default=False)
    as_json: bool = setting(False, "Print the report as JSON (docs/STATS.md).", flag="--json",
                            switch=True, show_default=False)
    decode: int | None = setting(None, "Print row ROW of --split as text with document "
                                 "boundaries marked.", metavar="ROW")
    split: str = setting("train", "Split for --decode.")
    plot: str | None = setting(None, "Write document-length and token-frequency plots to this "
                               "PNG.", metavar="FILE")
    throughput: float | None = setting(None, "Training throughput, for a time estimate.",
                                       metavar="TOKENS/S")
    budget: float | None = setting(None, "Training budget in tokens, for epochs and time.",
                                   metavar="TOKENS")
    eos_id: int | None = setting(None, "EOS id for data without a manifest (plain .npy or "
                                 "other tools' MDS).")
    mix: str | None = setting(None, "Several builds: each one's share of the mixture, as train "
                              "--mix takes them (PATH may be NAME=PATH; a bare path is named by "
                              "its folder) [each in proportion to its train rows].",
                              metavar="NAME=WEIGHT,...")
