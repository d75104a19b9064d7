"""What a trained run becomes for its users, reading the run and the build it trained on: the
`zoo` command (cli.py: export, generate, eval, list), a run's checkpoint read back as a model
with its tokenizer (runs.py), the Hugging Face folder of a run (hf_export.py: the layouts are
archs/hf's) and its model card (model_card.py), the command's settings (settings.py).

It stands on the trainer (the checkpoint reader, the val loss), the data stage and the models.

The Python API (longpack/api.py) takes the names below from here.
"""

import importlib

_API = {  # name -> the module that defines it
    "export_run": "runs", "load_run": "runs", "ExportConfig": "settings",
}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'longpack.zoo' has no attribute {name!r}")
    return getattr(importlib.import_module(f"longpack.zoo.{_API[name]}"), name)
