"""BuildState: everything a build's checkpoint holds, and nothing else.

A resumed build starts from exactly this: where reading stopped, what was counted, and each
split's unfinished row (the packer's carry) and partial shard (its sink's state). It is written
as OUT/.longpack-build/checkpoint.npz, one atomic file:

    state                   uint8: the JSON of every field below except the carries
    <split>_carry           the unfinished row's tokens, in the build's token dtype (best-fit:
                            the open window's documents' tokens, pack/best_fit.py)
    <split>_carry_segments  uint64 [m, 2]: (start, document hash) of each of its segments
                            (best-fit: of each of the window's documents)
    <split>_counters        best-fit only: uint64 [2], the window's position in the split's
                            stream and the padding so far

Each split's arrays are its packer's `state()`, named `<split>_<key>`, and a packer is made
again from them (output.py's make_packer).
"""

import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from longpack.core import write_bytes
from longpack.pipeline.config import SPLITS
from longpack.pipeline.manifest import empty_counts
from longpack.pipeline.read.records import REASONS


@dataclass
class BuildState:
    cursor: tuple[int, int] = (0, 0)  # (input file index, records of it read)
    input_done: bool = False  # every input read: only the last rows and shards are left
    runs: int = 0  # runs of this build that have started (this one included, once begun)
    skip_log_bytes: int = 0  # the valid length of skipped.jsonl
    counts: dict = field(default_factory=lambda: empty_counts(SPLITS, REASONS))
    sinks: dict = field(default_factory=dict)  # split -> ShardSink.state()
    carries: dict = field(default_factory=dict)  # split -> its packer's state(): name -> array

    def to_npz(self) -> memoryview:
        state = {"cursor": list(self.cursor), "input_done": self.input_done, "runs": self.runs,
                 "skip_log_bytes": self.skip_log_bytes, "counts": self.counts,
                 "splits": self.sinks}
        arrays = {"state": np.frombuffer(json.dumps(state).encode(), np.uint8)}
        for split, carry in self.carries.items():
            arrays.update({f"{split}_{name}": array for name, array in carry.items()})
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getbuffer()

    def save(self, path: Path) -> None:
        """Written atomically: a build killed meanwhile resumes from the checkpoint before."""
        write_bytes(path, self.to_npz())

    @classmethod
    def read(cls, path: Path) -> "BuildState":
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        state = json.loads(bytes(arrays.pop("state")).decode())
        carries = {s: {k[len(s) + 1:]: v for k, v in arrays.items() if k.startswith(s + "_")}
                   for s in SPLITS if f"{s}_carry" in arrays}
        return cls(cursor=tuple(state["cursor"]), input_done=state["input_done"],
                   runs=state["runs"], skip_log_bytes=state["skip_log_bytes"],
                   counts=state["counts"], sinks=state["splits"], carries=carries)
