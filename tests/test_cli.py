import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import make_texts, write_jsonl
from longpack.pipeline.cli import pack
from longpack.pipeline.formats.shards import open_split


def test_build_prints_a_summary_and_writes_the_layout(tmp_path, byte_tokenizer):
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(50)])
    out = tmp_path / "out"
    r = CliRunner().invoke(pack, ["build", "--dataset", "jsonl", "--input", str(tmp_path / "d.jsonl"),
                                  "--tokenizer", byte_tokenizer, "--seq", "128", "--out", str(out),
                                  "--val-fraction", "0.1", "--workers", "2"])
    assert r.exit_code == 0, r.output
    assert "50 documents" in r.output and "train" in r.output and "val" in r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["settings"]["seq"] == 128 and m["settings"]["workers"] == 2
    assert (out / "train" / "index.json").exists() and (out / "val" / "index.json").exists()


def test_user_errors_are_one_line_without_traceback(tmp_path, byte_tokenizer):
    r = CliRunner().invoke(pack, ["build", "--dataset", "jsonl", "--input", str(tmp_path / "nope"),
                                  "--tokenizer", byte_tokenizer, "--out", str(tmp_path / "o")])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "no such file or directory" in r.output
    r = CliRunner().invoke(pack, ["build", "--format", "memmap", "--compression", "zstd",
                                  "--out", str(tmp_path / "o"), "--input", str(tmp_path)])
    assert r.exit_code == 1 and "memmap shards are uncompressed" in r.output



@pytest.mark.parametrize("argv, said", [
    (["pack", "build", "--format", "npz"],
     "Error: Invalid value for '--format': 'npz' is not one of 'mds', 'memmap' "
     "(see 'pack build --help')"),
    (["pack", "bogus"], "Error: No such command 'bogus' (see 'pack --help')"),
    (["pack", "stats", "--nope"], "Error: No such option '--nope' (see 'pack stats --help')"),
    (["train"], "Error: Missing option '--shards' (see 'train --help')"),
    (["train", "--shards", "x", "--lr", "fast"],
     "Error: Invalid value for '--lr': 'fast' is not a valid float (see 'train --help')"),
    (["train", "--shards", "x", "--world-size", "2"],
     "Error: --world-size: only with --dry-run (they shape its plan)"),  # says what to do
    (["zoo", "export", "--zzzqqq"], "Error: No such option '--zzzqqq' (see 'zoo export --help')"),
])
def test_a_usage_error_is_one_line_that_says_where_help_is(argv, said):
    """click's usage errors printed the usage block and a hint above the error: three lines
    where every other refusal is one."""
    from longpack.training.cli import train
    from longpack.zoo.cli import zoo

    command = {"pack": pack, "train": train, "zoo": zoo}[argv[0]]
    r = CliRunner().invoke(command, argv[1:], prog_name=argv[0])
    assert r.exit_code == 2 and r.output == said + "\n"
    if argv[0] != "train":  # a group run bare prints its help, as click's groups do
        assert CliRunner().invoke(command, [], prog_name=argv[0]).output.startswith("Usage:")

@pytest.mark.slow
def test_mds_output_reads_back_with_plain_streaming_dataset(tmp_path, byte_tokenizer):
    write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in make_texts(200)])
    out = tmp_path / "out"
    r = CliRunner().invoke(pack, ["build", "--dataset", "jsonl", "--input", str(tmp_path / "d.jsonl"),
                                  "--tokenizer", byte_tokenizer, "--seq", "256", "--out", str(out),
                                  "--val-fraction", "0", "--shard-bytes", "4096", "--quiet"])
    assert r.exit_code == 0, r.output
    ours = list(open_split(out / "train").rows())
    # In a child process: StreamingDataset keeps shared memory and worker state per process.
    script = f"""
import numpy as np, sys
from longpack.pipeline.formats.streaming_compat import import_streaming
streaming = import_streaming()
ds = streaming.StreamingDataset(local={str(out / 'train')!r}, batch_size=1, shuffle=False)
rows = [ds[i] for i in range(len(ds))]
np.savez({str(tmp_path / 'sd.npz')!r},
         tokens=np.stack([r['tokens'] for r in rows]),
         starts=np.concatenate([r['doc_starts'] for r in rows]),
         hashes=np.concatenate([r['doc_hashes'] for r in rows]))
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    sd = np.load(tmp_path / "sd.npz")
    assert sd["tokens"].dtype == np.uint16 and sd["tokens"].shape == (len(ours), 256)
    assert np.array_equal(sd["tokens"], np.stack([t for t, _, _ in ours]))
    assert np.array_equal(sd["starts"], np.concatenate([s for _, s, _ in ours]))
    assert np.array_equal(sd["hashes"], np.concatenate([h for _, _, h in ours]))
    assert len(json.loads((out / "train" / "index.json").read_text())["shards"]) > 5


def test_importing_the_pipeline_pulls_in_neither_torch_nor_torchvision():
    code = ("import sys, longpack.pipeline.build, longpack.pipeline.cli, "
            "longpack.pipeline.formats.shards; "
            "print(sorted(m for m in ('torch', 'torchvision', 'streaming') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_a_misspelt_flag_is_one_line_with_the_nearest_names():
    from longpack.training.cli import train

    r = CliRunner().invoke(train, ["--batch-sise", "2"], prog_name="train")
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert r.output.startswith("Error: No such option '--batch-sise'")
    assert "Did you mean" in r.output and "'--batch-size'" in r.output
    assert r.output.endswith(" (see 'train --help')\n")
