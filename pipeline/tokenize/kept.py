"""A build's own copy of its tokenizer: OUT/tokenizer.tiktoken or OUT/tokenizer.json (by kind),
which the manifest's "tokenizer"."file" names beside its sha256 (docs/FORMAT.md).

    data = tokenizer_bytes(tok.identity())            # what a build writes (manifest.py)
    tok, why = load_build_tokenizer(manifest["tokenizer"], Path(BUILD))   # what a reader loads

A reader takes the copy first, then the file or name the build read (`source`: a build of before
the copy), each only with the sha256 the build recorded, so a build moved, or read from another
folder, still has its tokenizer; `why` says in words an error can quote why none loads.
"""

import hashlib
from pathlib import Path

from longpack.core import TokenizerError, sha256_file
from longpack.pipeline.tokenize.tokenizer import (
    TIKTOKEN_ENCODINGS,
    Tokenizer,
    canonical_ranks,
    load_tiktoken_name,
    load_tokenizer,
)

# What a build keeps of its tokenizer, by kind: OUT/<name> (pipeline/manifest.py)
COPY_NAMES = {"tiktoken": "tokenizer.tiktoken", "huggingface": "tokenizer.json"}


def load_build_tokenizer(recorded: dict,
                         folder: Path | None) -> tuple[Tokenizer | None, str | None]:
    """A build's tokenizer from its manifest's "tokenizer" (`recorded`) and the build's folder:
    the build's copy (FOLDER/<recorded "file">) first, then the file or name it was read from
    (`source`; a build of before the copy), each only with the sha256 the build recorded.
    Returns (the tokenizer, None), or (None, why none loads, in words an error can quote). The
    tokenizer takes the recorded name (a copy's file name says nothing of it)."""
    sha, source, kept = recorded.get("sha256"), recorded.get("source"), recorded.get("file")
    if recorded.get("kind") == "imported" or source is None:
        return None, (f"its build ({folder}) was imported without --tokenizer: it has token ids "
                      "and no tokenizer")
    tried = []
    for path in ([Path(folder) / kept] if kept and folder is not None else []) + [source]:
        try:
            if Path(path).is_file() and sha and sha256_file(Path(path)) != sha:
                tried.append(f"{path} has another sha256 than the build's {sha[:12]}")
                continue
            tok = load_tokenizer(str(path), bos=recorded.get("bos_id") is not None,
                                 encoding=encoding_of(recorded.get("name") or ""))
        except (OSError, ValueError, TokenizerError) as e:
            tried.append(str(e) if str(path) in str(e) else f"{path}: {e}")
            continue
        if sha and tok.sha256 != sha:
            tried.append(f"{path} gives a tokenizer of another sha256 than the build's "
                         f"{sha[:12]}")
            continue
        tok.name = recorded.get("name", tok.name)
        return tok, None
    if not kept:
        tried.insert(0, f"{folder} keeps no copy of its tokenizer (built before longpack kept "
                        "one)")
    return None, "; ".join(tried)


def tokenizer_bytes(identity: dict) -> bytes:
    """The bytes of the file a tokenizer of this identity (Tokenizer.identity(), a manifest's
    "tokenizer") was loaded from: its ranks file or tokenizer.json, or, for a tiktoken name,
    its canonical ranks file (whose sha256 is the official file's). TokenizerError unless they
    are there and have the identity's sha256."""
    source, sha = identity.get("source"), identity.get("sha256")
    if identity.get("kind") == "tiktoken" and source in TIKTOKEN_ENCODINGS and not (
            Path(source).is_file()):
        data = canonical_ranks(load_tiktoken_name(source).reference.impl._mergeable_ranks)
    else:
        try:
            data = Path(source).read_bytes()
        except (OSError, TypeError) as e:
            raise TokenizerError(f"cannot read the tokenizer file {source} "
                                 f"({getattr(e, 'strerror', None) or e})") from None
    if hashlib.sha256(data).hexdigest() != sha:
        raise TokenizerError(f"{source} changed since it was loaded (its sha256 is no longer "
                             f"{sha}): put the build's tokenizer back, or build again")
    return data


def encoding_of(name: str) -> str | None:
    """The tiktoken encoding a recorded tokenizer name uses: the name itself, or the encoding
    of a `STEM-1a2b3c4d` name given to a ranks file of no known hash (None: not one)."""
    if name in TIKTOKEN_ENCODINGS:
        return name
    stem, _, tail = name.rpartition("-")
    return stem if stem in TIKTOKEN_ENCODINGS and len(tail) == 8 else None


def fetch_kept(store, recorded: dict) -> Path | None:
    """The local folder holding the copy that a build at a URL (`store`: its longpack.core.store
    Store) keeps of its tokenizer, downloaded once and checked against its sha256: the user's
    cache, `longpack/tokenizers/<sha256>/<file>`; None when the build keeps none (or it is
    not one of COPY_NAMES). For load_build_tokenizer's `folder`."""
    import os

    from longpack.core import write_bytes

    name, sha = recorded.get("file"), recorded.get("sha256")
    if name not in COPY_NAMES.values() or not sha:
        return None
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longpack" \
        / "tokenizers" / sha
    if not (folder / name).is_file() or sha256_file(folder / name) != sha:
        data = store.read_bytes(name)
        if hashlib.sha256(data).hexdigest() != sha:
            return folder  # not written: load_build_tokenizer says the copy is missing
        folder.mkdir(parents=True, exist_ok=True)
        write_bytes(folder / name, data)
    return folder
