"""A finished build read back at random, as the trainer and the zoo's evaluation read it: its
manifest and rows (reader.py), each shard checked once per run (verify.py), shards at a URL or
stored compressed kept in a bounded local cache (cache.py), its tokenizer held to its manifest
and to the one a run recorded (identity.py)."""
