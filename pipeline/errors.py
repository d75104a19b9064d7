"""Typed errors. The CLI turns each into one line (click.ClickException), never a traceback."""


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
