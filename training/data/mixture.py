"""The order of a run's rows: which rows each step takes, from one build or several at set shares
(docs/TRAIN.md, "Rows and their order" and "Mixtures", say how and why).

    order = MixedOrder(sources, stages, global_batch, seed)
    order.step_rows(step)        # the step's rows, ids into MixedRows (source k: base_k + row)
    order.rows_before(step)      # rows each source gave to steps [0, step): O(stages)

One source's order (GlobalOrder) is a pure function of (seed, epoch, build fingerprint): step s
takes rows [s * G, (s + 1) * G) of the concatenation of epoch permutations, whatever the
number of processes; rank r takes the r-th slice. Several sources: each step gives source k
floor or ceil of w_k G rows, the extras spread by a golden-ratio rotation so that the long-run
shares are exact, and the step's rows are shuffled together. Positioning at any step reads
nothing. Each step's rows hash to a short id (`batch_hash`) that checkpoints keep, so a resume
proves it reproduces the steps it replaces.
"""

import bisect
import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from longpack.core import DataError, TrainingError, is_url
from longpack.pipeline import (
    Build,
    copy_fix,
    copy_problem,
    dataset_fingerprint,
    natural_weights,
    open_build,
    read_manifest,
    same_tokenizer,
    tokenizer_label,
)


def _epoch_seed(seed: int, epoch: int, fingerprint: str) -> int:
    digest = hashlib.sha256(f"{seed}:{epoch}:{fingerprint}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def epoch_permutation(num_rows: int, seed: int, epoch: int, fingerprint: str) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(_epoch_seed(seed, epoch, fingerprint)))
    return rng.permutation(num_rows)


class GlobalOrder:
    def __init__(self, num_rows: int, global_batch: int, seed: int, fingerprint: str):
        if num_rows < 1 or global_batch < 1:
            raise ValueError("need at least one row and a positive global batch")
        self.num_rows, self.global_batch = num_rows, global_batch
        self.seed, self.fingerprint = seed, fingerprint
        self._epochs: dict[int, np.ndarray] = {}  # the permutations in use: two at most

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._epochs:
            if len(self._epochs) >= 2:
                self._epochs.pop(min(self._epochs))
            self._epochs[epoch] = epoch_permutation(self.num_rows, self.seed, epoch,
                                                    self.fingerprint)
        return self._epochs[epoch]

    def rows(self, start: int, count: int) -> np.ndarray:
        """Global row ids at positions [start, start + count) of the endless epoch sequence."""
        out = np.empty(count, np.int64)
        done = 0
        while done < count:
            epoch, offset = divmod(start + done, self.num_rows)
            take = min(count - done, self.num_rows - offset)
            perm = self.permutation(epoch)
            out[done:done + take] = perm[offset:offset + take]
            done += take
        return out

    def step_rows(self, step: int) -> np.ndarray:
        return self.rows(step * self.global_batch, self.global_batch)

    def rank_rows(self, step: int, rank: int, world: int) -> np.ndarray:
        if self.global_batch % world:
            raise ValueError(f"global batch {self.global_batch} does not split over {world} ranks")
        per = self.global_batch // world
        return self.step_rows(step)[rank * per:(rank + 1) * per]


def batch_hash(rows: np.ndarray) -> str:
    """A short, stable id of a step's global rows (12 hex digits of sha256)."""
    return hashlib.sha256(np.ascontiguousarray(rows, dtype="<i8").tobytes()).hexdigest()[:12]


# -- several sources at set shares ------------------------------------------------------------

PERIOD = 10007  # Q, a prime: the extras' pattern repeats after it
STRIDE = 6185  # P, about Q / golden ratio


class StagePlan:
    """One stage's counts: `base` rows per source each step, and the running count of the
    extras over one period (`extra[k][t]`: source k's extras in the stage's steps 0..t-1)."""

    def __init__(self, weights: np.ndarray, global_batch: int, layout: list[int]):
        """`layout`: the sources in the order their parts lie on [0, R) (by build, so that
        the order --shards lists them in changes nothing)."""
        quota = weights * global_batch
        self.base = np.floor(quota + 1e-9).astype(np.int64)
        left = global_batch - int(self.base.sum())
        fractions = np.clip(quota - self.base, 0, None)[layout]
        ends = np.cumsum(fractions)
        ends = ends * (left / ends[-1]) if left else ends * 0  # the parts end exactly at R
        starts = np.concatenate([[0.0], ends[:-1]])
        t = np.arange(PERIOD)
        u = ((t * STRIDE) % PERIOD + 0.5) / PERIOD
        # extras of the part at step t: points u + j (j integer) in [start, end)
        per_step = np.empty((len(weights), PERIOD), np.int64)
        per_step[layout] = np.ceil(ends[:, None] - u) - np.ceil(starts[:, None] - u)
        self.extra = np.concatenate([np.zeros((len(weights), 1), np.int64),
                                     np.cumsum(per_step, 1)], 1)  # (sources, PERIOD + 1)

    def rows_in(self, steps: int) -> np.ndarray:
        """Rows of each source over the stage's first `steps` steps."""
        full, part = divmod(steps, PERIOD)
        return steps * self.base + full * self.extra[:, PERIOD] + self.extra[:, part]


class MixedOrder:
    """`sources`: [(rows, fingerprint)] in the order of MixedRows; `stages`: [(first step,
    shares as an array over the sources)], the first at step 0."""

    def __init__(self, sources: list[tuple[int, str]], stages: list[tuple[int, np.ndarray]],
                 global_batch: int, seed: int, max_epochs: list[float | None] | None = None):
        if global_batch < 1:
            raise ValueError("the global batch must be positive")
        self.global_batch = global_batch
        self.sizes = np.array([n for n, _ in sources], np.int64)
        self.fingerprints = [fp for _, fp in sources]
        self.bases = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.orders = [GlobalOrder(n, global_batch, seed, fp) for n, fp in sources]
        # sources in the order of their builds' fingerprints: a step's rows and hash do not
        # depend on the order --shards lists them in
        self._by_build = sorted(range(len(sources)), key=lambda k: self.fingerprints[k])
        self.starts, self.shares = [], []
        for start, weights in stages:
            weights = np.asarray(weights, np.float64)
            # a stage that repeats the shares before it is no new stage: the extras' schedule
            # goes on (so a resume's check, which merges them too, compares what is drawn)
            if not self.shares or np.abs(weights - self.shares[-1]).max() >= 1e-9:
                self.starts.append(start)
                self.shares.append(weights)
        self.plans = [StagePlan(w, global_batch, self._by_build) for w in self.shares]
        # rows of each source before each stage
        self.before = [np.zeros(len(sources), np.int64)]
        for j in range(1, len(self.starts)):
            steps = self.starts[j] - self.starts[j - 1]
            self.before.append(self.before[-1] + self.plans[j - 1].rows_in(steps))
        self.max_epochs = max_epochs or [None] * len(sources)
        # a 64-bit code per build for step hashes
        self._codes = np.array([int(fp[:16], 16) - (1 << 63) for fp in self.fingerprints],
                               np.int64)
        digest = hashlib.sha256(f"mix:{seed}".encode()).digest()
        self._seed_key = np.uint64(int.from_bytes(digest[:8], "little"))
        # steps are drawn a block at a time (the loader asks for them in turn, each micro-batch
        # and the step's hash again): about 64k rows a block, the last two blocks kept
        self._block_steps = max(1, min(1024, (1 << 16) // global_batch))
        self._blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def stage_at(self, step: int) -> int:
        return bisect.bisect_right(self.starts, step) - 1

    def rows_before(self, step: int) -> np.ndarray:
        """Rows each source gives to steps [0, step)."""
        j = self.stage_at(step)
        return self.before[j] + self.plans[j].rows_in(step - self.starts[j])

    def epochs_before(self, step: int) -> np.ndarray:
        return self.rows_before(step) / self.sizes

    def _counts(self, steps: np.ndarray) -> np.ndarray:
        """rows_before of each of `steps` (ascending): [len(steps), sources]."""
        out = np.empty((len(steps), len(self.sizes)), np.int64)
        stage = np.searchsorted(self.starts, steps, side="right") - 1
        for j in np.unique(stage):
            at = stage == j
            t = steps[at] - self.starts[j]
            full, part = np.divmod(t, PERIOD)
            plan = self.plans[j]
            out[at] = (self.before[j] + t[:, None] * plan.base
                       + full[:, None] * plan.extra[:, PERIOD] + plan.extra[:, part].T)
        return out

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Steps [b * B, (b + 1) * B) at once (B = self._block_steps): their rows as MixedRows
        ids and each row's source, [B, G] each. Source k's rows for the block are one run of
        its order, cut by its counts; a step with rows of two or more sources is shuffled."""
        if b in self._blocks:
            return self._blocks[b]
        steps = np.arange(b * self._block_steps, (b + 1) * self._block_steps + 1)
        before = self._counts(steps)
        counts = np.diff(before, axis=0)  # [B, sources]
        n, g = len(steps) - 1, self.global_batch
        ids = np.empty((n, g), np.int64)
        source = np.empty((n, g), np.int64)
        column = np.zeros(n, np.int64)  # where the next source's rows start in each step
        for k in self._by_build:
            drawn = self.orders[k].rows(int(before[0, k]), int(before[-1, k] - before[0, k]))
            step = np.repeat(np.arange(n), counts[:, k])
            first = np.concatenate([[0], np.cumsum(counts[:, k])[:-1]])
            col = column[step] + np.arange(len(drawn)) - first[step]
            ids[step, col] = drawn + self.bases[k]
            source[step, col] = k
            column += counts[:, k]
        mixed = (counts > 0).sum(1) > 1
        if mixed.any():
            order = np.argsort(self._keys(steps[:-1][mixed]), axis=1, kind="stable")
            ids[mixed] = np.take_along_axis(ids[mixed], order, 1)
            source[mixed] = np.take_along_axis(source[mixed], order, 1)
        if len(self._blocks) >= 2:
            self._blocks.pop(min(self._blocks))
        self._blocks[b] = ids, source
        return ids, source

    def _keys(self, steps: np.ndarray) -> np.ndarray:
        """A random 64-bit key per (step, position), a pure function of (seed, step, position)
        (splitmix64's finalizer of a counter): sorting a step's keys shuffles its rows."""
        x = (self._seed_key + (steps[:, None].astype(np.uint64) * np.uint64(self.global_batch)
                               + np.arange(self.global_batch, dtype=np.uint64)))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))

    def _step(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        b, t = divmod(step, self._block_steps)
        ids, source = self._block(b)
        return ids[t], source[t]

    def step_rows(self, step: int) -> np.ndarray:
        return self._step(step)[0].copy()  # the block stays as drawn

    def rank_rows(self, step: int, rank: int, world: int) -> np.ndarray:
        if self.global_batch % world:
            raise ValueError(f"global batch {self.global_batch} does not split over {world} ranks")
        per = self.global_batch // world
        return self.step_rows(step)[rank * per:(rank + 1) * per]

    def step_hash(self, step: int) -> str:
        """A short id of the step's rows (see the module docstring)."""
        ids, source = self._step(step)
        rows = ids - self.bases[source]
        if (source == source[0]).all():
            return batch_hash(rows)
        return batch_hash(np.stack([self._codes[source], rows], 1).ravel())

    @cached_property
    def history(self) -> list:
        """The stages as a checkpoint keeps them: [[first step, {build fingerprint: share}]]
        (sources at 0 left out), so a resume compares them whatever the sources are named."""
        out = []
        for start, shares in zip(self.starts, self.shares):
            mix = {}
            for fp, w in zip(self.fingerprints, shares):
                if w > 0:
                    mix[fp] = mix.get(fp, 0.0) + float(w)
            out.append([start, mix])
        return out

    def last_step(self, max_steps: int) -> tuple[int, int | None]:
        """(the steps the run may take, at most max_steps; the source that cuts it, or None):
        the steps before any source would pass its max_epochs."""
        limit, by = max_steps, None
        for k, epochs in enumerate(self.max_epochs):
            if epochs is None:
                continue
            allowed = int(epochs * self.sizes[k] + 1e-9)
            if self.rows_before(limit)[k] <= allowed:
                continue
            lo, hi = 0, limit  # the most steps whose rows of k stay within `allowed`
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.rows_before(mid)[k] <= allowed:
                    lo = mid
                else:
                    hi = mid - 1
            limit, by = lo, k
        return limit, by


def history_until(history: list, step: int) -> list:
    """The mixtures of steps [0, step) of a `history`: stages from step on left out, and a
    stage that repeats the one before it merged into it."""
    out = []
    for start, mix in history:
        if start >= step:
            break
        if not out or not same_shares(out[-1][1], mix):
            out.append([start, mix])
    return out


def same_shares(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-9 for k in a)


def same_until(a: list, b: list, step: int) -> bool:
    """Whether two histories give steps [0, step) the same mixtures."""
    a, b = history_until(a, step), history_until(b, step)
    return len(a) == len(b) and all(x[0] == y[0] and same_shares(x[1], y[1])
                                    for x, y in zip(a, b))


class MixedRows:
    """The train (or val) rows of several builds as one id space: source k's row r is
    bases[k] + r. `check`, `unchecked` and `get` as a single build's rows (pipeline/builds/reader.py)."""

    def __init__(self, parts: list):
        self.parts = parts
        self.bases = [0]
        for p in parts[:-1]:
            self.bases.append(self.bases[-1] + len(p))

    def __len__(self) -> int:
        return self.bases[-1] + len(self.parts[-1])

    def check(self, i: int) -> None:
        k = bisect.bisect_right(self.bases, int(i)) - 1
        self.parts[k].check(int(i) - self.bases[k])

    def unchecked(self) -> int:
        return sum(p.unchecked() for p in self.parts)

    def get(self, i: int):  # per row of every batch: no more than a bisect on top of the part's
        k = bisect.bisect_right(self.bases, i) - 1
        return self.parts[k].get(i - self.bases[k])


def same_tokens(names: list[str], manifests: list[dict], seqs: list[int]) -> None:
    """Refuse a mixture of builds whose ids mean other things or whose samples differ in
    length, naming both builds."""
    for name, manifest, seq in zip(names[1:], manifests[1:], seqs[1:]):
        if not same_tokenizer(manifest["tokenizer"], manifests[0]["tokenizer"]):
            raise DataError(f"--shards: {names[0]} and {name} were tokenized differently: "
                            f"{tokenizer_label(manifests[0]['tokenizer'])} vs "
                            f"{tokenizer_label(manifest['tokenizer'])}; a "
                            "mixture needs one tokenizer: rebuild one of them")
        if seq != seqs[0]:
            raise DataError(f"--shards: {names[0]} has rows of {seqs[0]} tokens and {name} of "
                            f"{seq}; pass --seq with a divisor of both, or rebuild one with "
                            "pack build --seq")


@dataclass
class Sources:
    """The builds a run trains on, named: one, or a mixture's. `train` is the rows the order's
    ids index; `vals` each source's val rows (None where it has none)."""

    names: list[str]
    builds: list[Build]

    @property
    def mixed(self) -> bool:
        return len(self.builds) > 1

    @property
    def seq(self) -> int:
        return self.builds[0].seq

    @property
    def manifest(self) -> dict:  # the tokenizer and seq every source shares
        return self.builds[0].manifest

    @property
    def fingerprint(self) -> str:
        """The build's fingerprint; a mixture's: of its sources' (by name)."""
        if not self.mixed:
            return self.builds[0].fingerprint
        text = json.dumps(sorted(zip(self.names, (b.fingerprint for b in self.builds))))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @cached_property
    def train(self):
        return MixedRows([b.train for b in self.builds]) if self.mixed else self.builds[0].train

    @property
    def vals(self) -> list[tuple[str, object | None]]:
        return [(n, b.val) for n, b in zip(self.names, self.builds)]


def open_sources(cfg, cache: Path) -> Sources:
    """Every --shards build, checked to share a tokenizer and a sample length."""
    sources = cfg.mixture()[0]
    builds, seen = [], {}
    for name, path in sources:
        def opened(step, *args, name=name):  # the source named in what fails, of several
            try:
                return step(*args)
            except DataError as e:
                raise DataError(f"{name}: {e}" if len(sources) > 1 else str(e)) from None

        manifest = opened(read_manifest, path)
        opened(refuse_damaged_copy, manifest, path)
        fingerprint = dataset_fingerprint(manifest)
        if fingerprint in seen:  # read in lockstep, every row twice
            raise DataError(f"--shards: {seen[fingerprint]} and {name} are the same build "
                            f"(fingerprint {fingerprint}); give it once, with the share of both")
        seen[fingerprint] = name
        builds.append(opened(open_build, path, cache, cfg.cache_limit, cfg.seq, manifest))
    names = [n for n, _ in sources]
    same_tokens(names, [b.manifest for b in builds], [b.seq for b in builds])
    return Sources(names, builds)


def refuse_damaged_copy(manifest: dict, location: str) -> None:
    """A local build whose copy of its tokenizer is missing or another file (pack stats' problem)
    is refused before a step: the run records the manifest's tokenizer, and its export, eval and
    generate would refuse the copy after the training was paid for. A build at a URL has its
    copy checked where it is fetched (longpack.pipeline.fetch_kept)."""
    if is_url(location):
        return
    tok = manifest["tokenizer"]
    problem = copy_problem(tok, Path(location))
    if problem:
        raise DataError(f"{Path(location) / str(tok.get('file'))}: {problem}; {copy_fix(tok)}")


def make_order(sources: Sources, cfg, global_batch: int) -> MixedOrder:
    """The run's order: --mix (or each source by its train rows) from step 0, then each
    --mix-stage from its first step (cfg.max_steps resolved: a stage at P% needs it)."""
    _, weights, stages, max_epochs = cfg.mixture()
    names = sources.names
    sizes = [len(b.train) for b in sources.builds]
    first = weights or natural_weights(dict(zip(names, sizes)))
    step_tokens = global_batch * (sources.seq - 1)
    starts = {}
    for stage in stages:
        at = stage.start_step(step_tokens, cfg.max_steps)
        if at >= cfg.max_steps:
            raise DataError(f"--mix-stage {stage.text}: starts at step {at:,}, and the run has "
                            f"{cfg.max_steps:,} steps (--max-steps): it would never be drawn; "
                            "drop it or start it sooner")
        if at in starts:
            raise DataError(f"--mix-stage: two stages start at step {at}")
        starts[at] = stage.weights
    starts.setdefault(0, first)  # a stage at step 0 replaces --mix
    shares = [(at, np.array([w[n] for n in names])) for at, w in sorted(starts.items())]
    for k, name in enumerate(names):
        if not any(w[k] > 0 for _, w in shares):
            raise DataError(f"--shards {name}: no stage draws from it (weight 0 throughout); "
                            "give it a weight in --mix or drop it")
    return MixedOrder([(n, b.fingerprint) for n, b in zip(sizes, sources.builds)], shares,
                      global_batch, cfg.seed, [max_epochs.get(n) for n in names])


def check_resume(found: tuple[dict, Path], data: "Sources", order: MixedOrder, cfg) -> None:
    """Refuse to resume a checkpoint (its state and folder) of other shards, another --seq,
    another mixture before its step (a stage that starts at its step or later may change), or
    another order of rows."""
    state, path = found
    # checkpoints before mixtures: one build, drawn from at every step
    saved = state.get("mixture") or [[0, {state["fingerprint"]: 1.0}]]
    step = state["step"]
    if not same_until(saved, order.history, step):
        if not data.mixed and len(saved) == 1:
            raise TrainingError(f"{path} was trained on other shards (fingerprint "
                                f"{state['fingerprint']}, these are {data.fingerprint}); pass "
                                "--resume never or the original --shards")
        raise TrainingError(f"{path} was trained on another mixture before its step {step} "
                            f"(stages {describe(saved, step)}; this run's "
                            f"{describe(order.history, step)}); pass the original --shards, "
                            "--mix and --mix-stage (a new stage may start at a step >= "
                            f"{step}), or --resume never")
    if state["seq"] != data.seq:
        raise TrainingError(f"{path} was trained with --seq {state['seq']}, this run has "
                            f"{data.seq}; pass --seq {state['seq']} or --resume never")
    was = state["config"]
    if was.get("seed", cfg.seed) != cfg.seed:
        raise TrainingError(f"{path} was trained with --seed {was['seed']} and this run has "
                            f"{cfg.seed}: its rows would come in another order; pass --seed "
                            f"{was['seed']} or --resume never")
    rows = state.get("global_batch")  # checkpoints before it: the hashes below catch it
    if rows is not None and rows != order.global_batch:
        per_step = cfg.batch_size * cfg.grad_accum
        world, was_world = order.global_batch // per_step, rows // (was["batch_size"] *
                                                                   was["grad_accum"])
        fix = (f"pass --grad-accum {rows // (cfg.batch_size * world)}"
               if rows % (cfg.batch_size * world) == 0 else
               f"pass a --batch-size and --grad-accum whose product is {rows // world}"
               if rows % world == 0 else f"run it on processes that divide {rows}")
        raise TrainingError(f"{path} was trained on {rows} rows a step ({was['batch_size']} "
                            f"x {was['grad_accum']} x {was_world} processes: --batch-size x "
                            f"--grad-accum x processes) and this run takes "
                            f"{order.global_batch} ({cfg.batch_size} x {cfg.grad_accum} x "
                            f"{world}); {fix}, or --resume never")
    for step_no, h in state["recent_hashes"]:
        if order.step_hash(step_no) != h:
            raise TrainingError(f"resume check failed: step {step_no} would read other rows "
                                "than the checkpointed run did (seed or global batch changed?)")


def describe(history: list, step: int) -> str:
    """Stages before `step` in a line: 'from 0: 3f2a..=0.70 9c1b..=0.30'."""
    return "; ".join(f"from {start}: " + " ".join(f"{fp[:8]}={w:.2f}" for fp, w in mix.items())
                     for start, mix in history_until(history, step))
