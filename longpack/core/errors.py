"""Every error a user can fix, for both stages: `pack` and `train` catch LongpackError alone
and print its one line (click.ClickException); anything else is a bug and keeps its traceback."""


class LongpackError(Exception):
    """A problem the user can fix; the message says what, where, and what to do."""


class InputError(LongpackError):
    """Bad input with --on-error fail, or input that cannot be used at all."""


class SettingsError(LongpackError):
    """Flags that contradict each other or an existing output directory."""


class TokenizerError(LongpackError):
    """A tokenizer that cannot be found, read, or used."""


class HubError(LongpackError):
    """The Hugging Face hub cannot be reached or does not have the data."""


class OutputError(LongpackError):
    """The output directory cannot be written: a full disk, a read-only or forbidden path."""


class TrainingError(LongpackError):
    """A run that cannot start or go on: a checkpoint that does not fit it, a loss not finite."""


class DataError(LongpackError):
    """Shards that cannot be trained on; the message names the file (and row)."""


class LoaderError(TrainingError):
    """The trainer's loader worker processes died or failed outside a typed error."""


class StorageError(LongpackError):
    """An object store that cannot be reached, read or written; the message names the URL."""


def install_hint(extra: str) -> str:
    """How to install longpack's optional `extra`, by its packages' names as pyproject.toml
    declares them: "pip install 'gcsfs>=2024.2' (the extra [gcs])". Not `pip install
    longpack[gcs]`: installed from a clone, that would look for longpack on the package index."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        packages = [r.split(";")[0].strip() for r in requires("longpack") or ()
                    if r.replace("'", '"').endswith(f'extra == "{extra}"')]
    except PackageNotFoundError:  # run from a folder without an install
        packages = []
    if not packages:
        return f"pip install -e '.[{extra}]' in longpack's clone"
    return "pip install " + " ".join(f"'{p}'" for p in packages) + f" (the extra [{extra}])"
