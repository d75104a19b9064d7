"""longpack's trainer over packed shards (issue 5, in progress).

So far: sampler.py (the global row order: deterministic, elastic, O(1) positioning, batch
hashes) and batch.py (rows -> input_ids, targets, doc_starts). Still to come: config, loader
workers, the loop, optimizers, checkpoints, metrics (see the issue).
"""
