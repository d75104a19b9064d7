"""pack build --tasks N: every split of the work gives back the single-machine build's bytes."""

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import build_tree, make_texts, write_byte_ranks, write_jsonl, write_parquet
from longpack.core.errors import SettingsError
from longpack.core.settings import to_flags
from longpack.pipeline.build import build
from longpack.pipeline.cli import pack
from longpack.pipeline.config import WORK_DIR, BuildConfig
from longpack.pipeline.distribute import tasks
from longpack.pipeline.distribute.layout import SplitLayout
from longpack.pipeline.distribute.plan import plan_shares
from longpack.pipeline.distribute.work_folder import owned_shards

# The corpora and tokenizers are made once for the module (no test changes them), so the
# single-machine builds the tasked ones are compared with are made once too (`single`).

@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tasks")


@pytest.fixture(scope="module")
def byte_tokenizer(module_tmp) -> str:
    return str(write_byte_ranks(module_tmp / "gpt2.tiktoken"))


@pytest.fixture(scope="module")
def byte_tokenizer_u32(module_tmp) -> str:
    return str(write_byte_ranks(module_tmp / "cl100k_base.tiktoken"))


@pytest.fixture(scope="module")
def single(module_tmp):
    """single(corpus, tokenizer, **settings): the tree of the single-machine build of those
    settings, built the first time a test asks for it."""
    trees = {}

    def tree(corpus: Path, tokenizer: str, **kw) -> dict:
        key = (str(corpus), tokenizer, tuple(sorted(kw.items())))
        if key not in trees:
            out = module_tmp / f"single-{len(trees)}"
            build(settings(out, corpus, tokenizer, **kw), show_progress=False)
            trees[key] = build_tree(out)
        return trees[key]

    return tree


@pytest.fixture(scope="module")
def jsonl_corpus(module_tmp) -> Path:
    """Five files of uneven size, a bad record and a skipped one among them."""
    folder = module_tmp / "jsonl"
    folder.mkdir()
    texts = make_texts(900, seed=3)
    bounds = [0, 100, 400, 420, 700, 900]
    for i in range(5):
        records = [{"text": t} for t in texts[bounds[i]:bounds[i + 1]]]
        if i == 2:
            records += [b"{not json", {"text": ""}]
        write_jsonl(folder / f"part{i}.jsonl", records)
    return folder


@pytest.fixture(scope="module")
def parquet_corpus(module_tmp) -> Path:
    """One large file of many row groups (tasks split it) and two small ones."""
    folder = module_tmp / "parquet"
    folder.mkdir()
    texts = make_texts(1200, seed=5)
    write_parquet(folder / "a.parquet", texts[:1000], row_group_size=40)
    write_parquet(folder / "b.parquet", texts[1000:1100], row_group_size=40)
    write_parquet(folder / "c.parquet", texts[1100:], row_group_size=1000)
    return folder


def settings(out: Path, corpus: Path, tokenizer: str, **kw) -> BuildConfig:
    dataset = "parquet" if corpus.name == "parquet" else "jsonl"
    base = dict(out=str(out), dataset=dataset, inputs=(str(corpus),), tokenizer=tokenizer,
                seq=128, val_fraction=0.1, shard_bytes=128 * 2 * 5, workers=2)
    return BuildConfig(**{**base, **kw})


def run_tasks_in_order(cfg: BuildConfig, order: list[int]) -> dict:
    manifests = [tasks.run_task(cfg, i) for i in order]
    assert all(m is None for m in manifests[:-1]), "only the last task done may merge"
    assert manifests[-1] is not None
    return manifests[-1]


# -- byte-identical for any N -------------------------------------------------------------------

@pytest.mark.parametrize("corpus_name,fmt,val,last_row,packing", [
    ("jsonl_corpus", "mds", 0.1, "pad", "best-fit"),
    ("jsonl_corpus", "memmap", 0.1, "drop", "concat"),
    ("jsonl_corpus", "mds", 0.0, "drop", "concat"),
    ("parquet_corpus", "mds", 0.1, "pad", "concat"),
    ("parquet_corpus", "memmap", 0.1, "drop", "concat"),
    ("parquet_corpus", "mds", 0.0, "drop", "concat")])
@pytest.mark.slow  # each case builds 14 times (~6 s)
def test_tasks_finishing_in_any_order_give_the_single_machine_bytes(
        request, tmp_path, byte_tokenizer, corpus_name, fmt, val, last_row, packing):
    """concat's tasks place rows by token counts (SplitLayout), best-fit's by windows
    (test_best_fit.py has more of those); --last-row drop is concat's."""
    corpus = request.getfixturevalue(corpus_name)
    kw = dict(format=fmt, val_fraction=val, last_row=last_row, packing=packing)
    single = build(settings(tmp_path / "single", corpus, byte_tokenizer, **kw), show_progress=False)
    want = build_tree(tmp_path / "single")
    assert single["counts"]["documents"] > 800
    rng = random.Random(f"{corpus_name}{fmt}{val}")
    for n in (1, 2, 3, 7):
        out = tmp_path / f"tasks{n}"
        order = rng.sample(range(n), n)
        run_tasks_in_order(settings(out, corpus, byte_tokenizer, tasks=n, **kw), order)
        assert build_tree(out) == want, f"{n} tasks finishing in order {order}"


@pytest.mark.slow
def test_bos_and_a_token_dtype_of_uint32_are_merged_alike(tmp_path, jsonl_corpus,
                                                          byte_tokenizer_u32):
    kw = dict(bos=False, shard_bytes=128 * 4 * 3)
    build(settings(tmp_path / "single", jsonl_corpus, byte_tokenizer_u32, **kw),
          show_progress=False)
    run_tasks_in_order(settings(tmp_path / "t", jsonl_corpus, byte_tokenizer_u32, tasks=4, **kw),
                       [3, 1, 0, 2])
    assert build_tree(tmp_path / "t") == build_tree(tmp_path / "single")


@pytest.mark.slow
def test_tasks_run_as_separate_processes_through_the_command_line(single, tmp_path,
                                                                  jsonl_corpus,
                                                                  byte_tokenizer):
    flags = to_flags(settings(tmp_path / "t", jsonl_corpus, byte_tokenizer, tasks=3),
                     skip=("task_index",))
    procs = [subprocess.Popen([sys.executable, "-m", "longpack.pipeline.cli", "build", *flags,
                               "--task-index", str(i), "--quiet"], env={
        **os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}) for i in range(3)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0, 0]
    assert build_tree(tmp_path / "t") == single(jsonl_corpus, byte_tokenizer)


@pytest.mark.slow
def test_the_task_index_comes_from_a_slurm_array_or_longpack_environment(
        single, tmp_path, jsonl_corpus, byte_tokenizer, monkeypatch):
    args = ["build", *to_flags(settings(tmp_path / "t", jsonl_corpus, byte_tokenizer),
                               skip=("tasks", "task_index"))]
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "5")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "6")  # element 6 of 5-6: task 1
    r = CliRunner().invoke(pack, args)
    assert r.exit_code == 0 and "task 1 of 2 done; 1 still to run (0)" in r.output, r.output
    for name in ("SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("LONGPACK_TASK_COUNT", "2")
    monkeypatch.setenv("LONGPACK_TASK_INDEX", "0")
    r = CliRunner().invoke(pack, args)
    assert r.exit_code == 0 and "train" in r.output, r.output
    assert build_tree(tmp_path / "t") == single(jsonl_corpus, byte_tokenizer)


@pytest.mark.slow
def test_without_a_task_index_every_task_runs_here_in_turn(single, tmp_path, jsonl_corpus,
                                                            byte_tokenizer):
    flags = to_flags(settings(tmp_path / "t", jsonl_corpus, byte_tokenizer, tasks=5))
    r = CliRunner().invoke(pack, ["build", *flags])
    assert r.exit_code == 0 and "900 documents" in r.output and " in 5 tasks, " in r.output, r.output
    assert build_tree(tmp_path / "t") == single(jsonl_corpus, byte_tokenizer)


# -- nothing under OUT until the merge; merge by hand; what is missing ---------------------------

@pytest.mark.slow
def test_unfinished_tasks_leave_no_dataset_and_name_what_is_missing(single, tmp_path,
                                                                    jsonl_corpus,
                                                                    byte_tokenizer):
    out = tmp_path / "t"
    cfg = settings(out, jsonl_corpus, byte_tokenizer, tasks=4)
    assert tasks.run_task(cfg, 2, merge=False) is None
    assert tasks.run_task(cfg, 0, merge=False) is None
    assert sorted(p.name for p in out.iterdir()) == [WORK_DIR]  # no train/, val/, manifest
    with pytest.raises(tasks.TasksUnfinished, match=r"2 of its 4 tasks are not done \(task 1, 3\)"):
        tasks.merge(out)
    r = CliRunner().invoke(pack, ["stats", str(out)])
    assert r.exit_code == 1 and "tasks 1, 3 of 4 are not done" in r.output, r.output
    assert "Traceback" not in r.output
    assert tasks.task_status(out) == {"tasks": 4, "done": [0, 2], "placed": [0],
                                      "missing": [1, 3]}
    for i in (1, 3):
        assert tasks.run_task(cfg, i, merge=False) is None
    r = CliRunner().invoke(pack, ["merge", str(out)])
    assert r.exit_code == 0 and "900 documents" in r.output, r.output
    assert build_tree(out) == single(jsonl_corpus, byte_tokenizer)
    r = CliRunner().invoke(pack, ["stats", str(out), "--verify"])
    assert r.exit_code == 0, r.output


@pytest.mark.slow
def test_merge_per_task_places_in_parallel_and_the_last_one_merges(single, tmp_path,
                                                                   jsonl_corpus,
                                                                   byte_tokenizer):
    out = tmp_path / "t"
    cfg = settings(out, jsonl_corpus, byte_tokenizer, tasks=3)
    for i in range(3):
        tasks.run_task(cfg, i, place=False, merge=False)
    assert tasks.task_status(out)["placed"] == []
    for i, expect in ((2, "task 2's shards placed"), (0, "task 0's shards placed"), (1, "train")):
        r = CliRunner().invoke(pack, ["merge", str(out), "--task-index", str(i)])
        assert r.exit_code == 0 and expect in r.output, r.output
    assert build_tree(out) == single(jsonl_corpus, byte_tokenizer)


# -- killed anywhere, re-run: the same bytes ------------------------------------------------------

KILLED_AT = """
import os, signal, sys
from pathlib import Path
from longpack.pipeline import build as build_mod
from longpack.pipeline.cli import pack

target, nth, real_replace = sys.argv[1], int(sys.argv[2]), os.replace
build_mod.CHECKPOINT_SECONDS = 0.0  # a checkpoint after every batch
seen = 0

def replace(src, dst):  # the file is complete: die just before its rename
    global seen
    if Path(dst).name == target:
        seen += 1
        if seen == nth:
            os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)

os.replace = replace
pack(sys.argv[3:])
"""


@pytest.mark.slow
@pytest.mark.parametrize("target,nth", [("checkpoint.npz", 2), ("done.json", 1),
                                        ("placed.json", 1), ("shard.00003.mds.zstd", 1),
                                        ("index.json", 1), ("skipped.jsonl", 1),
                                        ("manifest.json", 1)])
def test_a_task_killed_at_any_point_and_run_again_gives_the_same_bytes(
        single, tmp_path, jsonl_corpus, byte_tokenizer, target, nth):
    out = tmp_path / "t"
    flags = to_flags(settings(out, jsonl_corpus, byte_tokenizer, tasks=3), skip=("task_index",))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    for i in (0, 1):
        assert CliRunner().invoke(pack, ["build", *flags, "--task-index", str(i)]).exit_code == 0
    killed = subprocess.run([sys.executable, "-c", KILLED_AT, target, str(nth), "build", *flags,
                             "--task-index", "2", "--quiet"], env=env, capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / "manifest.json").exists()
    r = CliRunner().invoke(pack, ["build", *flags, "--task-index", "2"])
    assert r.exit_code == 0 and "train" in r.output, r.output
    assert build_tree(out) == single(jsonl_corpus, byte_tokenizer)


# -- refusals -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_different_task_count_or_a_single_build_is_refused_into_a_tasked_build(
        single, tmp_path, jsonl_corpus, byte_tokenizer):
    out = tmp_path / "t"
    tasks.run_task(settings(out, jsonl_corpus, byte_tokenizer, tasks=3), 1)
    with pytest.raises(SettingsError, match="is being built in 3 tasks; run its tasks with "
                                            "--tasks 3"):
        tasks.run_task(settings(out, jsonl_corpus, byte_tokenizer, tasks=2), 0)
    r = CliRunner().invoke(pack, ["build", *to_flags(settings(out, jsonl_corpus, byte_tokenizer),
                                                     skip=("tasks", "task_index"))])
    assert r.exit_code == 1 and "is being built in 3 tasks" in r.output, r.output
    with pytest.raises(SettingsError, match="holds a build split into 3 tasks: run its tasks"):
        build(settings(out, jsonl_corpus, byte_tokenizer), show_progress=False)
    # --overwrite starts it again with the new count
    run_tasks_in_order(settings(out, jsonl_corpus, byte_tokenizer, tasks=2, overwrite=True),
                       [0, 1])
    assert build_tree(out) == single(jsonl_corpus, byte_tokenizer)


@pytest.mark.parametrize("kw,message", [
    ({"tasks": 2, "max_tokens": 100}, "--max-tokens and --limit-docs cut the document order"),
    ({"tasks": 2, "task_index": 2}, r"--task-index 2 is not a task of --tasks 2 \(0 to 1\)"),
    ({"tasks": 0}, r"--tasks must be in 1..1048576 \(got 0\)"),
])
def test_bad_task_settings_are_one_line(tmp_path, jsonl_corpus, byte_tokenizer, kw, message):
    with pytest.raises(SettingsError, match=message):
        settings(tmp_path / "t", jsonl_corpus, byte_tokenizer, **kw)


# -- the plan and the layout --------------------------------------------------------------------

def test_shares_are_contiguous_balanced_and_cover_every_record(parquet_corpus):
    paths = sorted(parquet_corpus.iterdir())
    files = [(str(p), p.stat().st_size) for p in paths]
    for n in (1, 2, 3, 7, 40):
        shares = plan_shares(files, n, "text", paths)
        assert shares[0].start == (0, 0) and shares[-1].stop == (len(files), 0)
        assert all(a.stop == b.start for a, b in zip(shares, shares[1:]))
        sizes = [s.bytes for s in shares]
        assert sum(sizes) == sum(size for _, size in files)
        if n <= 3:  # the large file is cut at row groups: shares stay within a group's bytes
            assert max(sizes) - min(sizes) < 0.25 * max(sizes), sizes
    # hub files are never split (a footer would mean a download): whole files only
    assert all(s.start[1] == 0 for s in plan_shares(files, 3, "text", None))


def test_every_shard_but_the_last_is_written_by_the_one_task_holding_its_last_token():
    rng = np.random.default_rng(0)
    for _ in range(300):
        counts = rng.integers(0, 50, rng.integers(1, 30)).tolist()
        seq, per_shard = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        layout = SplitLayout(counts, seq, per_shard, str(rng.choice(["pad", "drop"])))
        owners = {}
        for i, n in enumerate(counts):
            for k in owned_shards(layout.offsets[i], n, seq, per_shard):
                start, end, padded = layout.span(k)
                assert layout.offsets[i] < end <= layout.offsets[i + 1] and not padded
                assert end - start == per_shard * seq  # full
                assert k not in owners
                owners[k] = i
        assert set(owners) | {layout.shards - 1} >= set(range(layout.shards))


# -- the real corpora (../shared's, or the sample shipped with the package) ------------------------

@pytest.mark.slow
@pytest.mark.parametrize("dataset,folder", [("fineweb-edu", "fineweb-edu-sample"),
                                            ("dolma", "dolma-sample")])
@pytest.mark.parametrize("fmt,val", [("mds", 0.02), ("memmap", 0.02), ("mds", 0.0)])
def test_real_corpora_split_into_tasks_give_the_single_machine_bytes(tmp_path, real_text, dataset,
                                                                     folder, fmt, val):
    base = dict(dataset=dataset, inputs=(str(real_text.data(folder)),),
                tokenizer=str(real_text.tokenizer("gpt2.tiktoken")), seq=2048,
                val_fraction=val, format=fmt, shard_bytes=2048 * 2 * 64)
    single = build(BuildConfig(out=str(tmp_path / "single"), **base), show_progress=False)
    assert (single["splits"]["val"]["documents"] > 0) == (val > 0)
    want = build_tree(tmp_path / "single")
    for n in (1, 2, 3, 7):
        out = tmp_path / f"t{n}"
        run_tasks_in_order(BuildConfig(out=str(out), tasks=n, **base),
                           random.Random(n).sample(range(n), n))
        assert build_tree(out) == want, f"{n} tasks"


def test_a_task_resumed_after_reading_its_whole_share_reports_the_share_done(
        tmp_path, jsonl_corpus, byte_tokenizer, monkeypatch):
    """A launcher sums its tasks' last reports: a task resumed from a checkpoint taken after
    all its input was read reads nothing more, and still reports its whole share behind it."""
    import longpack.pipeline.build as build_mod

    cfg = settings(tmp_path / "out", jsonl_corpus, byte_tokenizer, tasks=2)
    with monkeypatch.context() as mp:
        mp.setattr(build_mod.Build, "_finish", lambda self: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            tasks.run_task(cfg, 0, merge=False)
    reports = []
    tasks.run_task(cfg, 0, report=reports.append, merge=False)
    assert reports[-1].bytes_total > 0 and reports[-1].bytes_done == reports[-1].bytes_total


def test_placing_a_task_of_a_build_merged_meanwhile_does_nothing(tmp_path, jsonl_corpus,
                                                                 byte_tokenizer, monkeypatch):
    """A task reads the work folder, another process merges (the work folder goes), then the
    task places: nothing to do, not a traceback."""
    from longpack.pipeline.distribute import merge as merge_mod
    from longpack.pipeline.distribute.work_folder import TaskedBuild

    cfg = settings(tmp_path / "out", jsonl_corpus, byte_tokenizer, tasks=2)
    for i in range(2):
        tasks.run_task(cfg, i, merge=False)
    out = tmp_path / "out"
    build = TaskedBuild(out)
    assert not build.missing()  # what the placing task saw before the merge
    tasks.merge(out)
    monkeypatch.setattr(merge_mod, "_merged", lambda out: False)  # the merge ended in between
    assert merge_mod.place(out, 1, wait=False, build=build)
