"""longpack from Python (api.py): build, stats, merge, import_tokens, train, plan, export, with
the commands' settings and errors: `import longpack; longpack.build(out="./mds", ...)`; and
what drives the trainer from above, as the API does: `train --dry-run`'s plan (dry_run.py).

Also the kernel both of longpack's stages share: the errors a user can fix (errors.py), settings
declared once for flags and configs (settings.py), atomic writes and checksums (atomic.py), and
the one object store every URL goes through (store.py).

The data stage is `pipeline/`, the trainer `training/`, the models `archs/`; each takes these
names from here, never from the other. They load on first use, so that `import longpack` stays
cheap and pulls in neither torch nor fsspec.
"""

import importlib

_API = {  # name -> the module that defines it
    "LongpackError": "errors", "SettingsError": "errors", "DataError": "errors",
    "TrainingError": "errors", "LoaderError": "errors", "StorageError": "errors",
    "install_hint": "errors",  # how to install an extra, by its packages' names
    "setting": "settings", "click_options": "settings",  # settings declared once, both CLIs
    "write_bytes": "atomic", "sha256_file": "atomic",  # atomic writes, file checksums
    "Store": "store", "is_url": "store", "staging_folder": "store",  # object stores
    "redact": "store", "refuse_unwritable": "store",
    "build": "api", "stats": "api", "merge": "api", "import_tokens": "api",  # the commands
    "train": "api", "plan": "api", "export": "api",
}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'longpack' has no attribute {name!r}")
    return getattr(importlib.import_module(f"longpack.{_API[name]}"), name)
