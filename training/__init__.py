"""longpack's trainer over packed shards (docs/TRAIN.md).

    cli.py         `train`: flags generated from config.TrainConfig, --config, --dry-run
    loop.py        the loop, top to bottom: resume point, data, model, resume, run dir, steps
    step.py        one optimizer step: what the loop runs and --dry-run times (plan.py)
    checkpoint.py  save and load; building, checking and restoring a checkpoint's state
    upload.py      checkpoints to a bucket in the background, and back on a fresh machine
    data.py        a build's rows, any format, local or at a URL (through longpack.store)
    shard_cache.py the shards fetched or unpacked for data.py, within --cache-limit
    sampler.py     the global order of rows: (seed, epoch, fingerprint) -> rows of step s
    loader.py      micro-batches of this rank, built ahead by worker processes
    batch.py       rows -> input_ids, targets, doc_starts on the device
    distributed.py torchrun's processes (DDP), one process otherwise
    optim.py, schedule.py, metrics.py, verify.py (shards checked before use), plan.py (--dry-run)
"""
