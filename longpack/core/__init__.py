"""The kernel every part of longpack stands on, and that imports none of them: the errors a user
can fix (errors.py), settings declared once for flags and configs (settings.py), atomic writes
and checksums (atomic.py), the one object store every URL goes through (store.py), and the
click command class every command is declared with (command.py: a LongpackError is a one-line
error, anything else a bug with its traceback).

The data stage, the models and the trainer take these names from here:
`from longpack.core import DataError, Store`. They load on first use, so that importing the
kernel stays cheap and pulls in neither torch nor fsspec.
"""

from longpack.core.lazy import lazy_names

_KERNEL = {  # name -> the module that defines it
    # errors.py: what a user can fix, one line each; how to install an extra
    "LongpackError": "errors", "SettingsError": "errors", "DataError": "errors",
    "TrainingError": "errors", "LoaderError": "errors", "StorageError": "errors",
    "InputError": "errors", "TokenizerError": "errors", "HubError": "errors",
    "install_hint": "errors",
    # settings.py: settings declared once, for flags, config files and keywords
    "setting": "settings", "click_options": "settings", "settings_of": "settings",
    "check": "settings", "check_values": "settings", "values_checked": "settings",
    "kinds": "settings", "refuse_unknown": "settings", "suggest": "settings",
    "flag_of": "settings", "to_flags": "settings", "read_settings_file": "settings",
    # atomic.py: writes that appear whole or not at all, checksums
    "write_bytes": "atomic", "write_json": "atomic", "writing": "atomic",
    "open_write_ahead": "atomic", "sha256_file": "atomic", "TEMP_NAME": "atomic",
    "temp_name": "atomic", "no_follow": "atomic", "remedy": "atomic",
    # store.py: the one object store every URL goes through
    "Store": "store", "is_url": "store", "staging_folder": "store", "redact": "store",
    "refuse_unwritable": "store", "storage_errors": "store",
    # command.py: every command's class
    "Command": "command", "Group": "command", "OneLineUsageError": "command",
}
__all__ = sorted(_KERNEL)
__getattr__ = lazy_names(__name__, _KERNEL)
