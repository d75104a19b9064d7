"""Shared fixtures: a hermetic tiny tokenizer, corpus writers, and the ../shared corpus."""

import base64
import contextlib
import gzip
import itertools
import json
import os
import sys
from pathlib import Path

# One intra-op thread for torch and numpy's BLAS in the test process and the processes it starts
# (as torchrun gives each of its own), set before either is imported: the tiny models here gain
# nothing from a second thread, and on 2 cores shared with other work two threads fight over
# them (a 4-step neox-tiny run: 2.5 s on one thread, 7.5 s on two, beside other test runs).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from longpack.pipeline.formats.shards import open_split

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture
def no_streaming_shared_memory_left():
    """For a test that opens a mosaicml-streaming StreamingDataset in this process (the trainer
    never does: it reads shards through their formats). Every shared-memory block streaming
    opens registers its clean-up with atexit, so its file handles stay open until the process
    ends; over a whole suite in one process they would pass the open-files limit. After the
    test no dataset is in use: run those clean-ups now and forget them, then remove the lock
    files of its gone datasets (which every later dataset would walk)."""
    yield
    if "streaming" not in sys.modules:
        return
    import atexit
    import gc

    from longpack.pipeline.formats.streaming_compat import clear_stale_locks, import_streaming

    shared_memory = import_streaming().base.shared.SharedMemory
    for block in [o for o in gc.get_objects() if type(o) is shared_memory]:
        atexit.unregister(block.cleanup)
        block.cleanup()
    clear_stale_locks()


@pytest.fixture(autouse=True)
def signal_handlers_restored():
    """SIGINT, SIGTERM and SIGHUP as they were before the test: code run in this process that
    sets them (a loader worker's body ignores all three) would leave every later child process
    ignoring Ctrl+C (an ignored signal is inherited), and the tests that press it would wait in
    vain."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, handler in saved.items():
        if handler is not None and signal.getsignal(s) is not handler:
            signal.signal(s, handler)


def signals_as_from_a_shell():
    """preexec_fn of a child that must take Ctrl+C as a command started from a shell does:
    SIGINT, SIGTERM and SIGHUP at their defaults and unblocked, whatever this test process holds (an
    ignored or blocked signal is inherited, and Python then installs no KeyboardInterrupt)."""
    import signal

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


# The start of a child Python that cannot import longpack, as a user's that downloaded an
# exported folder: this venv's editable finder taken off its import path, and proven gone.
WITHOUT_LONGPACK = r'''
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
try:
    import longpack
except ImportError:
    pass
else:
    raise SystemExit("longpack imports in the child: the folder is not shown to stand alone")
# this environment's torchvision does not load (archs/hf/transformers_compat.py)
import transformers.utils.import_utils as available
available._torchvision_available = False
'''


def run_train_jobs(tmp: Path, jobs: list, timeout: float = 600) -> str:
    """Several `train` runs in one 2-process torchrun launch (tests/train_jobs.py: a launch
    is mostly start-up), from tmp/jobs.json; the launch's output. A launch still running
    after `timeout` is a hang: torchrun and every process under it are killed (a stuck worker
    leads a process group of its own and takes SIGTERM as "stop after this step") and the
    test fails. The output goes to a file: a pipe would wait for workers that outlive
    torchrun."""
    import signal
    import subprocess

    (tmp / "jobs.json").write_text(json.dumps(jobs))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(Path(__file__).with_name("train_jobs.py")), str(tmp / "jobs.json")]
    log = tmp / "launch.log"
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                             cwd=Path(__file__).parents[1])
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in [*descendants(p.pid), p.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            p.wait()
            pytest.fail(f"a 2-process launch still running after {timeout} s (a hang):\n"
                        f"{log.read_text()[-3000:]}")
    printed = log.read_text()
    assert p.returncode == 0, printed[-5000:]
    return printed


def descendants(pid: int) -> list[int]:
    """The processes started by `pid` and by those, from /proc (Linux)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


@contextlib.contextmanager
def one_thread_as_under_torchrun():
    """torchrun starts each process with OMP_NUM_THREADS=1, and one intra-op thread sums a
    matmul in one order: a single-process run compared with torchrun's processes uses one
    thread too, so both sum in the same order and their weights can be compared bitwise."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent where xdist is not loaded
def pytest_xdist_auto_num_workers(config):
    """pyproject's `-n auto`: the quick loop (`-m "not slow"`) on every core (at most 4), its
    tests each in their own folders and servers; a run with the slow tests in one process, as
    they start what the machine has one of: Ray clusters (`ray stop` stops every one here), the
    one-node Slurm, torchrun pairs that take both cores."""
    if (config.option.markexpr or "").strip() == "not slow":
        return min(4, os.cpu_count() or 1)
    return 0


@pytest.fixture(scope="session")
def slurm():
    """A real one-node Slurm on localhost for the session (about 8 s to install and start on a
    fresh machine, 0.3 s after): ../shared/tools/slurm_local.sh."""
    import subprocess

    script = SHARED / "tools" / "slurm_local.sh"
    if not script.is_file():
        pytest.skip(f"the one-node Slurm script is not at {script} (CI has it)")
    subprocess.run(["bash", str(script), "start"], check=True, capture_output=True)
    yield
    subprocess.run(["bash", str(script), "stop"], check=True, capture_output=True)


@pytest.fixture
def shared() -> Path:
    if not (SHARED / "data").is_dir():
        pytest.skip(f"the shared real corpus is not at {SHARED} (CI has it)")
    return SHARED


SAMPLES = Path(__file__).resolve().parents[1] / "pipeline" / "samples"


class Corpus:
    """Real text for a test that needs only a sample of it: ../shared's corpus where it is (CI),
    else the subset of it shipped with the package (pipeline/samples/, tools/make_samples.py:
    400 FineWeb-Edu-schema rows, 180 Dolma records, GPT-2's ranks file)."""

    def __init__(self, root: Path, shipped: bool):
        self.root, self.shipped = root, shipped

    def data(self, folder: str) -> Path:
        """The folder of "fineweb-edu-sample" or "dolma-sample"."""
        return self.root / folder if self.shipped else self.root / "data" / folder

    def tokenizer(self, name: str) -> Path:
        """A tokenizer file of ../shared/tokenizers; only gpt2.tiktoken ships, the others skip."""
        path = self.root / name if self.shipped else self.root / "tokenizers" / name
        if not path.is_file():
            pytest.skip(f"{name} is in the shared corpus only, not at {SHARED} (CI has it); the "
                        "shipped sample has gpt2.tiktoken")
        return path


@pytest.fixture
def real_text() -> Corpus:
    if (SHARED / "data").is_dir():
        return Corpus(SHARED, shipped=False)
    return Corpus(SAMPLES, shipped=True)


def write_byte_ranks(path: Path) -> Path:
    """A .tiktoken ranks file of the 256 single bytes: every byte is one token (hermetic, fast)."""
    lines = [base64.b64encode(bytes([b])) + b" " + str(b).encode() for b in range(256)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def write_byte_tokenizer_json(path: Path) -> Path:
    """A Hugging Face tokenizer.json of the 256 single bytes (GPT-2's byte-level alphabet, no
    merges) and <|endoftext|> = 256: a vocabulary of 257, so a zoo model trained on its build
    is mostly its layers, not a 50,257-row embedding and head (a tiny run ~5x faster, its
    checkpoints ~50x smaller than at GPT-2's vocabulary)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))  # the other bytes stand in as the next code points
    alphabet = {b: chr(b) if b in printable else chr(next(shifted)) for b in range(256)}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    path.write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
        "added_tokens": [{"id": 256, "content": "<|endoftext|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
        "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {alphabet[b]: b for b in range(256)}, "merges": []}}))
    return path


@pytest.fixture
def byte_tokenizer(tmp_path) -> str:
    """Named gpt2.tiktoken, so it takes GPT-2's pattern and <|endoftext|> = 50256 (uint16)."""
    return str(write_byte_ranks(tmp_path / "gpt2.tiktoken"))


@pytest.fixture
def byte_tokenizer_u32(tmp_path) -> str:
    """Named cl100k_base.tiktoken: its special tokens reach id 100276, so rows are uint32."""
    return str(write_byte_ranks(tmp_path / "cl100k_base.tiktoken"))


def make_texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "δέλτα", "ε", "long-context", "<|endoftext|>", "\n", "€"]
    return [" ".join(rng.choice(words, size=int(rng.integers(1, 120)))) + f" #{i}"
            for i in range(n)]


def write_jsonl(path: Path, records: list, compress: str | None = None) -> Path:
    data = b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n"
                    for r in records)
    if compress == "gz":
        data = gzip.compress(data)
    elif compress == "zst":
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def write_parquet(path: Path, texts: list, row_group_size: int = 50) -> Path:
    pq.write_table(pa.table({"text": texts, "id": [str(i) for i in range(len(texts))]}), path,
                   row_group_size=row_group_size)
    return path


def build_tree(out: Path) -> dict[str, bytes]:
    """Every file under `out`, hidden ones included, manifest.json without its timings: what
    two builds of the same inputs and settings must share byte for byte."""
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
             if p.is_file()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("timings")
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


def split_documents(out: Path, split: str, eos_id: int) -> list[np.ndarray]:
    """Documents of a split, in order: rows concatenated, padding removed, cut after each EOS."""
    tokens = []
    for row, starts, hashes in open_split(out / split).rows():
        if hashes is not None and hashes[-1] == 0:  # padding segment
            row = row[: starts[-1]]
        tokens.append(np.asarray(row))
    if not tokens:
        return []
    stream = np.concatenate(tokens).astype(np.int64)
    cuts = np.flatnonzero(stream == eos_id) + 1
    assert len(cuts) == 0 or cuts[-1] == len(stream), "stream must end with EOS"
    return np.split(stream, cuts)[:-1]


def small_build(folder: Path, tokenizer, name: str, n_docs: int, seed: int, seq: int = 65,
                val_fraction: float = 0.1) -> Path:
    """folder/NAME: n_docs short documents (make_texts) in MDS rows of `seq` tokens, 8 rows a
    shard, a val split."""
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    src = write_jsonl(folder / f"{name}.jsonl", [{"text": t} for t in make_texts(n_docs, seed)])
    build(BuildConfig(out=str(folder / name), dataset="jsonl", inputs=(str(src),),
                      tokenizer=str(tokenizer), seq=seq, val_fraction=val_fraction,
                      shard_bytes=seq * 2 * 8), show_progress=False)
    return folder / name


@pytest.fixture(scope="session")
def shards_once(tmp_path_factory) -> Path:
    """The small build of `shards`, made once per test run: read it, never change it (a
    module-scoped fixture that trains on it shares it; a test takes `shards`, its own copy).
    Its tokenizer is the 257-entry byte-level one (write_byte_tokenizer_json): the trainer's
    tests train on it, fast."""
    tmp = tmp_path_factory.mktemp("shards")
    return small_build(tmp, write_byte_tokenizer_json(tmp / "bytes-tokenizer.json"), "mds", 200,
                       seed=0, val_fraction=0.05)


@pytest.fixture(scope="session")
def gpt2_vocab_shards_once(tmp_path_factory) -> Path:
    """The same documents built with `byte_tokenizer` (GPT-2's vocabulary of 50,257), once per
    test run, for what is sized by the vocabulary of a real tokenizer. Read it, never change it."""
    tmp = tmp_path_factory.mktemp("gpt2_vocab_shards")
    return small_build(tmp, write_byte_ranks(tmp / "gpt2.tiktoken"), "mds", 200, seed=0,
                       val_fraction=0.05)


@pytest.fixture(scope="session")
def build_32k_once(tmp_path_factory) -> Path:
    """A small build of 32k-token rows (the seeds' longest; their shorter lengths are windows
    of them) in GPT-2's vocabulary (the shipped ranks: the configs' memory lines are at a real
    tokenizer's), memmap, once per test run: the seeds' configs are planned on it. Read it,
    never change it."""
    from longpack.pipeline.build import build
    from longpack.pipeline.config import BuildConfig

    tmp = tmp_path_factory.mktemp("b32k")
    write_jsonl(tmp / "d.jsonl", [{"text": t} for t in make_texts(2000)])
    build(BuildConfig(out=str(tmp / "out"), dataset="jsonl", inputs=(str(tmp / "d.jsonl"),),
                      tokenizer="gpt2", seq=32768, val_fraction=0.2, format="memmap"),
          show_progress=False)
    return tmp / "out"


def vocab_of(build: Path) -> int:
    """The vocabulary a build was tokenized with (its manifest's), which the trainer sizes a
    model at."""
    return json.loads((Path(build) / "manifest.json").read_text())["tokenizer"]["vocab_size"]


@pytest.fixture
def shards(tmp_path, shards_once) -> Path:
    """A small MDS build for the trainer: 65-token rows, several shards, a val split (this
    test's copy of `shards_once`: a copy takes ~10 ms, a build ~0.3 s)."""
    import shutil

    return Path(shutil.copytree(shards_once, tmp_path / "mds"))


# -- a real S3-compatible server (moto's, in this process) on the loopback ---------------------

@pytest.fixture(scope="session")
def _moto_server():
    moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


class S3Bucket:
    """A fresh bucket on the test server: `url(prefix)` is s3://NAME/prefix, `client` boto3's."""

    def __init__(self, endpoint: str, name: str):
        import boto3

        self.endpoint, self.name = endpoint, name
        self.client = boto3.client("s3", endpoint_url=endpoint)
        self.client.create_bucket(Bucket=name)

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.name}/{prefix}".rstrip("/")

    def keys(self, prefix: str = "") -> dict[str, int]:
        """key -> size of every object under `prefix`."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name,
                                                                     Prefix=prefix)
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}

    def read(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()

    def upload_tree(self, local: Path, prefix: str) -> str:
        for path in sorted(local.rglob("*")):
            if path.is_file():
                self.client.upload_file(str(path), self.name, f"{prefix}/{path.relative_to(local)}")
        return self.url(prefix)


@pytest.fixture
def s3(_moto_server, tmp_path, monkeypatch, request) -> S3Bucket:
    """A real S3 server on 127.0.0.1 with a fresh bucket; every S3 client of the process and its
    subprocesses points at it through S3_ENDPOINT_URL and dummy credentials (exported)."""
    for key, value in {"S3_ENDPOINT_URL": _moto_server,
                       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1",
                       # nothing of this machine's own AWS setup
                       "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
                       "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
                       # without credentials botocore would ask the instance-metadata address
                       # (off the loopback) for some, and wait a second or two for no answer
                       "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    test = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40]
    return S3Bucket(_moto_server, f"b{next(_bucket_numbers)}-{test}".rstrip("-"))


_bucket_numbers = itertools.count()
