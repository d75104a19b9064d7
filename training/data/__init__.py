"""What the trainer reads: the run's builds (read back by pipeline/builds/), their rows in a
seeded order, several as one mixture (mixture.py), cut into batches by worker processes
(loader.py)."""
