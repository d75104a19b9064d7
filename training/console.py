"""The run's console lines, which a lost reader never stops: `train ... | head -1`, a `tee` that
died, a stdout on a full device. The run's record is metrics.jsonl and its checkpoints; the
console is a view of it, so when a line cannot be written the run carries on without one.
(A closed terminal's SIGHUP is a stop request, as Ctrl+C: training/loop.py's stop_requested.)
"""

import errno
import os
import sys

# a reader gone, a terminal gone, a full device, a closed descriptor
STREAM_ERRORS = (errno.EPIPE, errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EBADF)


class Console:
    """`say` (print, click.echo, a caller's own) guarded: the first OSError writing a line
    (EPIPE, EIO, ENOSPC...) ends the console. If stdout is what broke (its flush fails, or the
    error is of a stream's kind), it is pointed at /dev/null, so that neither a later print
    nor the interpreter's flush at exit fails (Python's "Exception ignored ...
    BrokenPipeError" and exit 120); stderr gets one line saying so, if it still can."""

    def __init__(self, say):
        self.say, self.lost = say, None

    def __call__(self, line: str) -> None:
        if self.lost is not None:
            return
        try:
            self.say(line)
        except OSError as e:
            self.lost = e
            # a failed flush may drop what was buffered, so the next one can pass: the error's
            # kind says it too
            if e.errno in STREAM_ERRORS or _flush_fails(sys.stdout):
                _to_devnull(sys.stdout)
            with_reason = e.strerror or type(e).__name__
            try:
                print(f"longpack: the console's output failed ({with_reason}): training goes "
                      "on without console lines; its metrics.jsonl and checkpoints go on as "
                      "before", file=sys.stderr, flush=True)
            except OSError:
                pass


def _flush_fails(stream) -> bool:
    try:
        stream.flush()
        return False
    except OSError:
        return True
    except ValueError:  # closed
        return True


def _to_devnull(stream) -> None:
    """Point the stream's file descriptor at /dev/null (what is buffered goes there too)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)
    try:
        stream.flush()
    except (OSError, ValueError):
        pass
