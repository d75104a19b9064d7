"""The processes of a run: torchrun's launch and the few collectives the trainer makes
(distributed.py), and FSDP2's sharding (fsdp.py)."""
