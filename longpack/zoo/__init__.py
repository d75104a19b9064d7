"""What a trained run becomes for its users, reading the run and the build it trained on: the
`zoo` command (cli.py: export, generate, eval, list), a run's checkpoint read back as a model
with its tokenizer (runs.py), the Hugging Face folder of a run (hf_export.py: the layouts are
archs/hf's) and its model card (model_card.py), the command's settings (settings.py).

It stands on the trainer (the checkpoint reader, the val loss), the data stage and the models.

The Python API (longpack/api.py) takes the names below from here.
"""

from longpack.core import lazy_names

_API = {  # name -> the module that defines it
    "export_run": "runs", "load_run": "runs", "ExportConfig": "settings",
}
__all__ = sorted(_API)
__getattr__ = lazy_names(__name__, _API)
