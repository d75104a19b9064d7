"""A build's tokenizer is part of its identity: what gives its ids their meaning is checked
wherever a build is read for them (docs/FORMAT.md, "The tokenizer's copy").

    copy_problem(manifest["tokenizer"], Path(OUT))          # pack stats: the copy it keeps
    other_tokenizer(recorded, manifest["tokenizer"], Path(OUT), "OUT")   # a run against a build

A build keeps a copy of its tokenizer (OUT/tokenizer.tiktoken or tokenizer.json, which the
manifest's tokenizer.file names beside its sha256); a run records its build's "tokenizer" in
every checkpoint (training/checkpoints/checkpoint.py's `capture`). Either check reads the copy's
bytes (a hash of a few MB); a build that keeps none (made before the copy, or imported
without --tokenizer) has nothing of it to check.
"""

from pathlib import Path

from longpack.core import sha256_file


def _short(sha) -> str:
    return sha[:12] if isinstance(sha, str) and sha else "none"


def copy_problem(recorded: dict, folder: Path) -> str | None:
    """What is wrong with the copy of its tokenizer that the build in `folder` keeps
    (`recorded`: its manifest's "tokenizer"), in words after its file name: missing, or bytes
    of another sha256 than the manifest's. None when it is sound or the manifest names none."""
    from longpack.pipeline.tokenize.kept import COPY_NAMES

    name = recorded.get("file")
    if name is None:
        return None
    if name not in COPY_NAMES.values():  # never a path: the copy is a file of OUT's root
        return (f"manifest.json names {name!r} as the build's tokenizer, which is none of "
                f"{', '.join(COPY_NAMES.values())}")
    path = Path(folder) / name
    if not path.is_file():
        return "missing (manifest.json names it: the tokenizer the build's ids were made with)"
    got = sha256_file(path)
    if got != recorded.get("sha256"):
        return (f"its sha256 is {_short(got)}, manifest.json's tokenizer.sha256 "
                f"{_short(recorded.get('sha256'))}: it is not the tokenizer the build's ids were "
                "made with (replaced or damaged)")
    return None


def copy_fix(recorded: dict) -> str:
    """How to make a build's copy of its tokenizer sound again."""
    return (f"put back the file of sha256 {_short(recorded.get('sha256'))} (the build read "
            f"{recorded.get('source')}), or re-run the same pack build with --overwrite")


def other_tokenizer(recorded: dict | None, theirs: dict | None, folder: Path | None,
                    where: str) -> str | None:
    """Why the build at `where` (its manifest's "tokenizer" `theirs`; `folder`: the local folder
    holding its copy, None for a build at a URL) is not of the tokenizer a run recorded
    (`recorded`), naming both sha256s; None when it is, or when nothing can be compared (a
    checkpoint of before the record, no manifest). The copy counts, whatever the manifest says:
    a build folder whose copy was replaced no longer carries the run's tokenizer."""
    from longpack.pipeline.manifest import same_tokenizer, tokenizer_label

    if recorded is None or theirs is None:
        return None
    ours = tokenizer_label(recorded)
    if not same_tokenizer(recorded, theirs):
        return f"{where} is a build of {tokenizer_label(theirs)}, the run trained with {ours}"
    name = theirs.get("file")
    if folder is None or name is None or not (Path(folder) / name).is_file():
        return None  # a missing copy: the manifest's source may still be the tokenizer
    got = sha256_file(Path(folder) / name)
    if got != recorded.get("sha256"):
        return (f"{str(where).rstrip('/')}/{name} is a tokenizer of sha256 {_short(got)}, the "
                f"run trained with {ours}")
    return None
