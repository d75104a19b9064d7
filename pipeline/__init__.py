"""longpack's data stage: documents in, packed fixed-length token rows out.

    --input / hub   catalog.py, hub.py        which files, in which order
      |  read_parquet.py, read_jsonl.py       records: text, or a counted Skip (records.py)
      v
    inputs.py       batches of texts from one file (the unit of work and of resumption)
      |  encode.py (worker threads)           hash + split (split.py), tokens + EOS (tokenizer.py)
      v
    pack.py         rows of exactly --seq tokens + per-row document segments (pure)
      |  writers.py                           write-ahead partial files -> whole shards
      v
    write_mds.py / write_memmap.py            OUT/{train,val}/ shards + index.json
    manifest.py                               OUT/manifest.json, written last

build.py runs the arrows and checkpoints; cli.py is the `pack` command. docs/FORMAT.md is the
single source of truth for the on-disk format.
"""
