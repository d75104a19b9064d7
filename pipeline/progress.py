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
    def __init__(self, total_bytes: int | None, max_tokens: int | None, enabled: bool | None = None):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.total_bytes, self.max_tokens = total_bytes, max_tokens
        self.start = self.last = time.monotonic()
        self.docs = self.tokens = self.bytes_done = 0

    def update(self, docs: int, tokens: int, bytes_done: int) -> None:
        self.docs, self.tokens, self.bytes_done = docs, tokens, bytes_done
        now = time.monotonic()
        if not self.enabled or now - self.last < 0.5:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        fraction = None
        if self.max_tokens:
            fraction = tokens / self.max_tokens
        if self.total_bytes and bytes_done:
            by_bytes = bytes_done / self.total_bytes
            fraction = by_bytes if fraction is None else max(fraction, by_bytes)
        eta = f" ETA {_clock(elapsed * (1 - fraction) / fraction)}" if fraction else ""
        done = f" {100 * min(fraction, 1):.1f}%" if fraction else ""
        sys.stderr.write(f"\r{_si(docs)} docs ({_si(docs / elapsed)}/s) {_si(tokens)} tokens "
                         f"({_si(tokens / elapsed)}/s){done}{eta} \x1b[K")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
