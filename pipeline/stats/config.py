"""The settings of one `pack stats`; its flags are these fields (longpack/core/settings.py). Loads
no numpy: `pack --help` reads it."""

import os
from dataclasses import dataclass

from longpack.core import SettingsError, check, setting


@dataclass(frozen=True, kw_only=True)
class StatsConfig:
    paths: tuple[str, ...] = setting(argument=True, multiple=True, metavar="PATH...",
                                     path=True)
    verify: bool = setting(False, "Also check checksums, token ids, document starts and "
                           "continued documents' hashes.", switch=True, show_default=False)
    as_json: bool = setting(False, "Print the report as JSON (docs/STATS.md).", flag="--json",
                            switch=True, show_default=False)
    decode: int | None = setting(None, "Print row ROW of --split as text with document "
                                 "boundaries marked.", metavar="ROW", min=0)
    split: str = setting("train", "Split for --decode.")
    plot: str | None = setting(None, "Write document-length and token-frequency plots to this "
                               "PNG.", metavar="FILE", path=True)
    throughput: float | None = setting(None, "Training throughput, for a time estimate.",
                                       metavar="TOKENS/S", min=0, min_open=True)
    budget: float | None = setting(None, "Training budget in tokens, for epochs and time.",
                                   metavar="TOKENS", min=0, min_open=True)
    eos_id: int | None = setting(None, "EOS id for data without a manifest (plain .npy or "
                                 "other tools' MDS).", min=0)
    mix: str | None = setting(None, "Several builds: each one's share of the mixture, as train "
                              "--mix takes them (PATH may be NAME=PATH; a bare path is named by "
                              "its folder) [each in proportion to its train rows].",
                              metavar="NAME=WEIGHT,...")

    def __post_init__(self):
        # refused before a shard is read: a report of minutes must not end in a bad flag
        check(self)  # each field's type, range and choices, as declared above
        if self.plot is not None:
            folder = os.path.dirname(os.path.abspath(os.path.expanduser(self.plot)))
            if not os.path.isdir(folder):
                raise SettingsError(f"--plot {self.plot}: there is no folder {folder}; create "
                                    "it or choose another path")
            if os.path.isdir(self.plot):
                raise SettingsError(f"--plot {self.plot} is a folder; name the PNG file")
            self._refuse_plot_over_data()

    def _refuse_plot_over_data(self) -> None:
        """The PNG replaces only a PNG (an earlier plot), never a file of a build it reports
        on nor any other file of the user's."""
        plot = os.path.realpath(os.path.expanduser(self.plot))
        for given in self.paths:
            path = given.split("=", 1)[1] if "=" in given and "://" not in given else given
            root = os.path.realpath(os.path.expanduser(path))
            if "://" not in path and (plot == root or plot.startswith(root + os.sep)):
                raise SettingsError(f"--plot {self.plot} is inside {given}, which the report "
                                    "reads: name a file elsewhere")
        if os.path.exists(plot):
            with open(plot, "rb") as f:
                if f.read(8) != b"\x89PNG\r\n\x1a\n":
                    raise SettingsError(f"--plot {self.plot} exists and is not a PNG: refusing "
                                        "to replace it; name a new file")
