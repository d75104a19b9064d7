"""longpack's trainer over packed shards (docs/TRAIN.md), by role:

    loop.py        the loop, top to bottom: processes, resume point, data, model, steps
    step.py        one optimizer step: what the loop runs and --dry-run times
    config.py      TrainConfig: `train`'s settings and the rules that tie them together
    cli.py         `train`: flags generated from TrainConfig, --config, --dry-run
    dry_run.py     --dry-run's plan: the loop's own setup (setup.py), a timed step, the memory
    optim.py       the optimizers by parameter role, and the learning rate by step
    evaluate.py    the val loss;  metrics.py  where the records go;  fits.py  the memory floor
    data/          the run's builds, their rows' order and mixtures (mixture), the loader and
                   batches (loader); a build is read through pipeline/builds/
    checkpoints/   a step's checkpoint and its DCP files (checkpoint), the bucket (upload)
    parallel/      torchrun's processes (distributed) and FSDP2 (fsdp)
    presets.py     the presets at a build's vocabulary (train --list-models, zoo list)

What the rest of longpack (the zoo, the Python API) uses of the trainer is the names below, and
only those: `from longpack.training import TrainConfig, train`. They load on first use, so that
`import longpack.training` pulls in nothing heavy until a name is used.
"""

from longpack.core import lazy_names

_API = {  # name -> the module that defines it ("module:attr" where the names differ)
    "TrainConfig": "config", "train": "loop", "plan": "dry_run",  # a run, its plan
    "name_answers": "names:answers",  # other trainers' names for a setting, answered with ours
    "read_checkpoint": "checkpoints.checkpoint", "model_state": "checkpoints.checkpoint",
    "split_loss": "evaluate", "bits_per_byte": "evaluate",  # zoo eval
    "sized_presets": "presets",  # zoo list
}
__all__ = sorted(_API)
__getattr__ = lazy_names(__name__, _API)
