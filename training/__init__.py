"""longpack's trainer over packed shards (docs/TRAIN.md), by role:

    loop.py        the loop, top to bottom: processes, resume point, data, model, steps
    step.py        one optimizer step: what the loop runs and --dry-run times
    config.py      TrainConfig: `train`'s settings and the rules that tie them together
    cli.py         `train`: flags generated from TrainConfig, --config, --dry-run (its plan:
                   longpack/dry_run.py, above the trainer)
    optim.py       the optimizers by parameter role, and the learning rate by step
    evaluate.py    the val loss;  metrics.py  where the records go;  fits.py  the memory floor
    data/          the run's builds, their rows' order and mixtures (mixture), the loader and
                   batches (loader); a build is read through pipeline/builds/
    checkpoints/   a step's checkpoint and its DCP files (checkpoint), the bucket (upload)
    parallel/      torchrun's processes (distributed) and FSDP2 (fsdp)
"""
