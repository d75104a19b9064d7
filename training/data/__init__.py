"""What the trainer reads: a build's splits (builds.py), in a seeded order, several as one mixture
(mixture.py), checked (verify.py) and cached from a bucket (shard_cache.py), cut into batches by
worker processes (loader.py)."""
