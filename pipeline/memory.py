"""Give memory that numpy has freed back to the operating system.

glibc serves shard-sized buffers from per-thread heaps once its dynamic mmap threshold has grown
past them, and keeps them when they are freed: a scan's peak memory then depends on how the
read-ahead threads' buffers happened to interleave, ~10% more and different from run to run
(tools/bench_stats.py, docs/BENCHMARKS.md). malloc_trim(0) returns those free pages. Other C
libraries (macOS, musl, Windows) have no malloc_trim: nothing to do there.
"""

import ctypes


def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
