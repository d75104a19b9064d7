"""The readers of `pack import` (import_tokens.py): each source file as [N, seq] integer rows,
or one InputError line naming the file.

  .npy  its header checked first (never unpickled, never read past its end), then memory-mapped
  .npz  numpy.savez's archive: each array in the archive's order, read as a .npy is (never
        unpickled): an [N, seq] array is rows; a 1-D array is a token stream cut into rows of
        --seq as a .bin is, its tail (fewer than --seq ids) dropped and counted (`tails`)
  .pt   torch.load(weights_only=True): a pickle of more than tensors is refused, never run
  .bin  a flat run of --dtype ids (BIN_DTYPES, little-endian), cut at --seq
  an MDS folder: its `tokens` column, a shard at a time
`at_least` compares ids with a bound exactly for every integer type (no float64 on the way).
"""

import math
import warnings
from pathlib import Path

import numpy as np

from longpack.core import InputError, SettingsError

SUFFIXES = (".npy", ".npz", ".pt", ".bin")


def read_blocks(path: Path, cfg, tails: list | None = None):
    """The source's rows, [n, width] integer arrays one after another (one for a file, one a
    shard for an MDS folder, one an array for a .npz); InputError naming the file for anything
    else. `tails` gets (rows before it, ids dropped, the array's name) for each .npz token
    stream's tail."""
    if path.is_dir():
        from longpack.pipeline.formats.shards import ShardError, SplitReader

        try:
            reader = SplitReader(path)
            for i in range(len(reader.format)):
                yield _integer_rows(reader.format.shard_file(i), reader.read_shard(i).tokens,
                                    "its tokens column holds")
        except ShardError as e:
            raise InputError(f"{e.path}: {e.what}") from None
        return
    if path.stat().st_size == 0:
        raise InputError(f"{path}: an empty file (0 bytes), not token rows: remove it or write "
                         "it again")
    if path.suffix == ".npz":
        yield from _read_npz(path, cfg, tails)
        return
    read = {".npy": _read_npy, ".pt": _read_pt}.get(path.suffix, _read_bin)
    yield _integer_rows(path, read(path, cfg), "it holds")


def _read_npz(path: Path, cfg, tails: list | None):
    """Each array of the archive in its order, loaded one at a time (a zip member is not
    memory-mapped) with allow_pickle=False: an array of Python objects is refused, never
    unpickled."""
    import zipfile

    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise InputError(f"{path}: not a .npz file ({_one_line(e)}): write it with numpy.savez")\
            from None
    with archive:
        if not isinstance(archive, np.lib.npyio.NpzFile):  # a .npy under another name
            archive = {"arr_0": archive}
        before = 0
        for name in list(archive.keys()):
            where = f"{path}, array {name!r}:"
            try:
                array = archive[name]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
                what = ("holds Python objects, which import never unpickles: save the ids as "
                        "integer arrays" if "allow_pickle" in str(e) else
                        f"cannot be read ({_one_line(e)}): write it again")
                raise InputError(f"{where} {what}") from None
            if array.ndim == 1 and np.issubdtype(array.dtype, np.integer):
                if cfg.seq is None:
                    raise SettingsError(f"{where} a 1-D token stream: pass --seq to cut it "
                                        "into rows (a .npz of [N, seq] arrays needs none)")
                whole = len(array) // cfg.seq * cfg.seq
                rows = array[:whole].reshape(-1, cfg.seq)
                if whole < len(array) and tails is not None:
                    tails.append((before + len(rows), len(array) - whole, name))
            else:
                rows = _integer_rows(path, array, f"its array {name!r} holds")
            before += len(rows)
            yield rows


def _read_npy(path: Path, cfg) -> np.ndarray:
    """Memory-mapped, after its header is checked: never unpickled, never read past its end."""
    fmt = np.lib.format
    try:
        with open(path, "rb") as f:
            major, _ = fmt.read_magic(f)  # 3.0 differs from 2.0 only in the header's encoding
            header = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
            shape, _, dtype = header(f)
            data_at = f.tell()
    except (OSError, ValueError, SyntaxError) as e:
        raise InputError(f"{path}: not a .npy file ({_one_line(e)}): write it with numpy.save")\
            from None
    if dtype.hasobject:
        raise InputError(f"{path}: holds Python objects (dtype {dtype}), which import never "
                         "unpickles: save the ids as an integer array")
    need = math.prod(shape) * dtype.itemsize
    if path.stat().st_size - data_at < need:
        raise InputError(f"{path}: truncated: its header says {dtype} {list(shape)} "
                         f"({need:,} bytes), the file holds {path.stat().st_size - data_at:,} "
                         "after the header: write it again")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot be read as token rows ({_one_line(e)})") from None


def _read_pt(path: Path, cfg) -> np.ndarray:
    """torch.load(weights_only=True) (given explicitly: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD cannot
    turn it off), so a pickle of anything but tensors is refused, never run."""
    import pickle

    import torch

    try:
        with warnings.catch_warnings():  # a damaged pickle's protocol warning: not one line
            warnings.simplefilter("ignore")
            rows = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        why = ("its pickle holds more than tensors, which torch.load(weights_only=True) refuses "
               "(none of it was run)" if "weights only" in str(e).lower() else _one_line(e))
        raise InputError(f"{path}: not a plain tensor file: {why}; save the rows alone "
                         "(torch.save(rows, PATH)) or as .npy") from None
    except Exception as e:  # a damaged zip or pickle: whatever torch's reader raised
        raise InputError(f"{path}: not a readable torch.save file ({_one_line(e)}): write it "
                         "again") from None
    if not isinstance(rows, torch.Tensor):
        raise InputError(f"{path}: holds a {type(rows).__name__}, not a tensor: import takes a "
                         "file of one [N, seq] integer tensor (torch.save(rows, PATH))")
    if rows.layout != torch.strided:
        raise InputError(f"{path}: a {rows.layout} tensor: save rows.to_dense()")
    if rows.dtype not in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                          torch.uint16, torch.uint32, torch.uint64):
        raise InputError(f"{path}: a {rows.dtype} tensor of shape {list(rows.shape)}: import "
                         "takes [N, seq] integer ids")
    try:
        return rows.detach().numpy()
    except (RuntimeError, TypeError) as e:
        raise InputError(f"{path}: cannot be read as token rows ({_one_line(e)})") from None


def _read_bin(path: Path, cfg) -> np.ndarray:
    """A flat run of --dtype (little-endian) ids, cut at --seq; the tail is the caller's."""
    if cfg.seq is None or cfg.dtype is None:
        raise SettingsError(f"{path}: a .bin file needs --seq and --dtype (nanoGPT's GPT-2 "
                            "data: --dtype uint16)")
    dtype = np.dtype(cfg.dtype).newbyteorder("<")
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise InputError(f"{path}: {size:,} bytes are not whole {cfg.dtype} ids: check --dtype")
    try:
        flat = np.memmap(path, dtype=dtype, mode="r")
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot be read as token rows ({_one_line(e)})") from None
    return flat[: len(flat) // cfg.seq * cfg.seq].reshape(-1, cfg.seq)


def _integer_rows(path: Path, rows: np.ndarray, what: str) -> np.ndarray:
    if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.integer):
        raise InputError(f"{path}: {what} {rows.dtype} values of shape {list(rows.shape)}; "
                         "import takes [N, seq] integer ids")
    return rows


def _one_line(e: BaseException) -> str:
    """An exception as one line (torch's and numpy's messages may run to many)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def at_least(ids: np.ndarray, value: int) -> np.ndarray:
    """ids >= value, exact for every integer dtype: the bound is a scalar of the ids' own type
    (or settles it), never a float64 that uint64 and int64 might meet on the way."""
    info = np.iinfo(ids.dtype)
    if value <= info.min:
        return np.ones(ids.shape, bool)
    if value > info.max:
        return np.zeros(ids.shape, bool)
    return ids >= ids.dtype.type(value)
