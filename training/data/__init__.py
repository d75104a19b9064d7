"""What the trainer reads: a build's splits (builds.py), several as one mixture (mixture.py), in a
seeded order (sampler.py), checked (verify.py) and cached from a bucket (shard_cache.py), cut into
batches (batch.py) by worker processes (loader.py)."""
