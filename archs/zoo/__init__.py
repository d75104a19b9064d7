"""What a trained run becomes for its users: the `zoo` command (cli.py), a run's checkpoint read
back as a model (runs.py), Hugging Face transformers folders (hf_export.py, with the modeling
code shipped for the families transformers has no class for: modeling_longpack.py and
configuration_longpack.py, copied as they are, never imported here), a model card, and
generation. It depends on the models (archs) and on the trainer's checkpoint reader."""
