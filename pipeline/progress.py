"""A one-line progress display on a terminal (documents/s, tokens/s, ETA), silent otherwise."""

import sys
import time


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


class Progress:
    """Rates and ETA count only this run's work: a resumed build starts from `done`
    (documents, tokens, bytes of input already behind it), not from zero.

    What a Build is told how far it is (build.py), as is a task's report to its launcher
    (distribute/task_build.py's TaskReports): `begin` when reading begins, `update` a few
    times a second, `finished` once the whole share is behind it, `close` at the end."""

    def __init__(self, total_bytes: int | None = None, max_tokens: int | None = None,
                 enabled: bool | None = None, done: tuple[int, int, int] = (0, 0, 0)):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.begin(total_bytes, max_tokens, done)

    def begin(self, total_bytes: int | None, max_tokens: int | None,
              done: tuple[int, int, int] = (0, 0, 0)) -> None:
        self.total_bytes, self.max_tokens = total_bytes, max_tokens
        self.start = self.last = time.monotonic()
        self.at_start = done
        self.docs, self.tokens, self.bytes_done = done

    def _fraction(self, tokens: int, bytes_done: int) -> float | None:
        """Share of the whole build behind it: by tokens under --max-tokens, by input bytes."""
        fraction = None
        if self.max_tokens:
            fraction = tokens / self.max_tokens
        if self.total_bytes and bytes_done:
            by_bytes = bytes_done / self.total_bytes
            fraction = by_bytes if fraction is None else max(fraction, by_bytes)
        return fraction

    def update(self, docs: int, tokens: int, bytes_done: int) -> None:
        self.docs, self.tokens, self.bytes_done = docs, tokens, bytes_done
        now = time.monotonic()
        if not self.enabled or now - self.last < 0.5:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        docs0, tokens0, bytes0 = self.at_start
        fraction = self._fraction(tokens, bytes_done)
        fraction0 = self._fraction(tokens0, bytes0) or 0.0
        eta = ""
        if fraction and fraction > fraction0:
            eta = f" ETA {_clock(elapsed * (1 - min(fraction, 1)) / (fraction - fraction0))}"
        done = f" {100 * min(fraction, 1):.1f}%" if fraction else ""
        new_docs, new_tokens = docs - docs0, tokens - tokens0
        sys.stderr.write(f"\r{_si(docs)} docs ({_si(new_docs / elapsed)}/s) {_si(tokens)} tokens "
                         f"({_si(new_tokens / elapsed)}/s){done}{eta} \x1b[K")
        sys.stderr.flush()

    def finished(self, documents: int, tokens: int, total_bytes: int) -> None:
        pass  # the line was cleared when reading ended

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
