"""Which part of the inputs each task of `pack build --tasks N` reads: its share.

The inputs in document order (read/catalog.py) are cut into pieces: a file, or, for a local parquet
file larger than a task's share of the bytes, each of its row groups. Pieces go to tasks in
order, by bytes: a piece belongs to the task whose equal share of the total holds the piece's
middle byte. So every task reads one contiguous stretch of the document order, shares differ by
at most about one piece, and the plan is a pure function of the files, their sizes and footers:
every task computes the same plan on its own, nothing is exchanged. With more tasks than pieces
some tasks get no input (their share is empty; they still finish, with nothing).

A share is given as two read cursors, (file index, records of that file already read), the
same cursor a build checkpoints: the task reads from `start` up to `stop`.
"""

import itertools
from dataclasses import dataclass

from longpack.pipeline.read.catalog import file_format
from longpack.pipeline.read.parquet import parquet_file


@dataclass(frozen=True)
class Share:
    start: tuple[int, int]
    stop: tuple[int, int]
    bytes: int  # input bytes of its pieces (for progress)


@dataclass(frozen=True)
class _Piece:
    cursor: tuple[int, int]  # where reading the piece starts
    bytes: int


def share_of(files, tasks: int, text_field: str, task: int | None) -> Share:
    """The part of the inputs `files` (read/inputs.py's InputFiles, or read/hub.py's HubFiles)
    a build reads: all of them (`task` None), or task `task`'s share of `tasks`."""
    if task is None:
        return Share((0, 0), None, sum(size for _, size in files.files))
    # hub files are not split: reading a footer would mean downloading the file
    return plan_shares(files.files, tasks, text_field, getattr(files, "paths", None))[task]


def plan_shares(files: list[tuple[str, int]], tasks: int, text_field: str,
                sources: list | None) -> list[Share]:
    """`files`: (path, size) in build order; `sources`: the files to read parquet footers from
    (local Paths or objects at URLs, read by range), or None (hub files are not split: reading
    a footer would mean downloading the file)."""
    total = sum(size for _, size in files)
    pieces = []
    for i, (path, size) in enumerate(files):
        groups = (_row_groups(sources[i], size, text_field)
                  if sources and tasks > 1 and size * tasks > total
                  and file_format(path) == "parquet" else None)
        if groups:
            pieces += [_Piece((i, first), nbytes) for first, nbytes in groups]
        else:
            pieces.append(_Piece((i, 0), size))
    weight = sum(p.bytes for p in pieces)
    owners, before = [], 0
    for p in pieces:
        owners.append(min(tasks - 1, (2 * before + p.bytes) * tasks // (2 * weight))
                      if weight else 0)
        before += p.bytes
    end = (len(files), 0)
    bounds, shares_bytes, k = [], [0] * tasks, 0  # bounds[t]: the first piece of task t or later
    for t in range(tasks + 1):
        while k < len(pieces) and owners[k] < t:
            k += 1
        bounds.append(pieces[k].cursor if k < len(pieces) else end)
    for p, owner in zip(pieces, owners):
        shares_bytes[owner] += p.bytes
    return [Share(bounds[t], bounds[t + 1], shares_bytes[t]) for t in range(tasks)]


def _row_groups(source, size: int, text_field: str) -> list[tuple[int, int]] | None:
    """(first row, stored bytes) of each row group, or None when the file should be read whole:
    its footer is unreadable or it lacks the text column (the reader then counts one skip for
    the whole file, as a single-machine build does), or it has one group."""
    try:
        with parquet_file(source) as pf:
            meta = pf.metadata
        if text_field not in meta.schema.to_arrow_schema().names:
            return None
    except Exception:  # not parquet, a damaged footer: the reader reports it
        return None
    firsts, stored, first = [], [], 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        firsts.append(first)
        stored.append(sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)))
        first += rg.num_rows
    if len(firsts) < 2:
        return None
    # The file's bytes shared out in proportion to the groups' (the footer's go with them), so
    # a split file weighs what it would weigh whole.
    total = max(1, sum(stored))
    ends = [size * c // total for c in itertools.accumulate(stored)]
    return list(zip(firsts, (b - a for a, b in zip([0, *ends], ends))))
