"""A run's checkpoints: its step folders, written whole (saving.py) and resumed exactly, the
model's and optimizers' tensors in DCP files (checkpoint.py), and their copies in a bucket
(upload.py). Nothing read from a checkpoint runs code."""
