"""A build split into tasks whose files are damaged between the tasks and `pack merge` (bit rot
on a shared file system, a cut or removed file, a record that is not JSON): the merge refuses
in one line naming the file and the task to re-run, and that re-run, then the merge, gives the
single-machine build's bytes."""

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import build_tree, make_texts, write_byte_ranks, write_jsonl
from longpack.core.errors import SettingsError
from longpack.core.settings import to_flags
from longpack.pipeline.build import build
from longpack.pipeline.cli import pack
from longpack.pipeline.config import WORK_DIR, BuildConfig
from longpack.pipeline.distribute import tasks
from longpack.pipeline.distribute.work_folder import SEAL, seal

TASKS = 3


def slow(*case):
    """A case of a parametrized damage for the whole suite only: the quick loop keeps one or two
    of each kind (each case re-runs a task and merges, ~2 s)."""
    return pytest.param(*case, marks=pytest.mark.slow)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """The corpus, the single-machine build's files, and two states of a build in 3 tasks, all
    done and not merged: each task placed its shards ("placed"), or none did ("unplaced")."""
    root = tmp_path_factory.mktemp("damage")
    tokenizer = str(write_byte_ranks(root / "gpt2.tiktoken"))
    corpus = root / "jsonl"
    corpus.mkdir()
    texts = make_texts(600, seed=7)
    for i, (a, b) in enumerate([(0, 150), (150, 300), (300, 450), (450, 600)]):
        records = [{"text": t} for t in texts[a:b]]
        if i == 1:
            records += [b"{not json", {"text": ""}]
        write_jsonl(corpus / f"part{i}.jsonl", records)
    made = {"tokenizer": tokenizer, "corpus": corpus}
    build(settings(root / "single", made), show_progress=False)
    made["want"] = build_tree(root / "single")
    for state, place in (("placed", True), ("unplaced", False)):
        cfg = settings(root / state, made, tasks=TASKS)
        for i in range(TASKS):
            assert tasks.run_task(cfg, i, place=place, merge=False) is None
        made[state] = root / state
    return made


def settings(out: Path, made: dict, **kw) -> BuildConfig:
    return BuildConfig(out=str(out), dataset="jsonl", inputs=(str(made["corpus"]),),
                       tokenizer=made["tokenizer"], seq=128, val_fraction=0.1,
                       shard_bytes=128 * 2 * 5, workers=2, **kw)


def copy_of(made: dict, state: str, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(made[state], out)
    return out


def work(out: Path, name: str) -> Path:
    return out / WORK_DIR / name


def one_line_error(args: list[str]) -> str:
    r = CliRunner().invoke(pack, args)
    assert r.exit_code != 0, r.output
    assert "Traceback" not in r.output and isinstance(r.exception, SystemExit), r.exception
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
    return lines[0]


def task_named(message: str) -> int:
    """The task the message says to re-run, as the command it gives."""
    m = re.search(rf"re-run task (\d+) to write it again \(the build's command with --tasks "
                  rf"{TASKS} --task-index (\d+)\)", message)
    assert m and m[1] == m[2], message
    return int(m[1])


def rerun_and_merge(made: dict, out: Path, index: int) -> None:
    flags = to_flags(settings(out, made, tasks=TASKS), skip=("task_index",))
    r = CliRunner().invoke(pack, ["build", *flags, "--task-index", str(index)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(pack, ["merge", str(out)])
    assert r.exit_code == 0 and "600 documents" in r.output, r.output
    assert build_tree(out) == made["want"]


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


# -- 1. bit rot and cut files in a task's documents and log ----------------------------------------

@pytest.mark.parametrize("state,name,at", [
    ("placed", "task.00002/train.tokens", -50),  # the last shard, which the merge cuts
    slow("unplaced", "task.00001/train.tokens", 0.5),  # read by the placement the merge does
    ("unplaced", "task.00001/train.docs", 0.5),
    slow("unplaced", "task.00000/val.tokens", 0.3),
    slow("placed", "task.00001/skipped.jsonl", 0.5),
])
@pytest.mark.slow
def test_a_byte_changed_in_a_task_file_is_refused_and_the_named_task_rewrites_it(
        made, tmp_path, state, name, at):
    out = copy_of(made, state, tmp_path)
    path = work(out, name)
    flip(path, at if isinstance(at, int) else int(path.stat().st_size * at))
    message = one_line_error(["merge", str(out)])
    assert str(path) in message and "damaged since task" in message, message
    assert task_named(message) == int(name[5:10])
    rerun_and_merge(made, out, task_named(message))


@pytest.mark.slow
def test_a_cut_token_file_names_its_task_and_its_re_run_mends_it(made, tmp_path):
    out = copy_of(made, "unplaced", tmp_path)
    path = work(out, "task.00002/train.tokens")
    path.write_bytes(path.read_bytes()[:-10])
    message = one_line_error(["merge", str(out)])
    assert str(path) in message and task_named(message) == 2, message
    rerun_and_merge(made, out, 2)


def test_a_finished_task_run_again_with_its_files_intact_does_not_run_again(made, tmp_path):
    out = copy_of(made, "placed", tmp_path)
    done = work(out, "task.00001/done.json")
    before = done.stat().st_mtime_ns, done.read_bytes()
    cfg = settings(out, made, tasks=TASKS)
    assert tasks.run_task(cfg, 1, merge=False) is None
    assert (done.stat().st_mtime_ns, done.read_bytes()) == before
    record = json.loads(done.read_text())
    assert record["block_bytes"] == 1 << 24 and record[SEAL] == seal(record)[SEAL]
    assert sorted(record["files"]) == ["skipped.jsonl", "train.docs", "train.tokens",
                                       "val.docs", "val.tokens"]
    tokens = work(out, "task.00001/train.tokens")
    assert record["files"]["train.tokens"]["bytes"] == tokens.stat().st_size


# -- 2. records that are not JSON, or not of their shape ---------------------------------------------

def edit_json(path: Path, change) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def spoil(path: Path, text: str | None, change) -> None:
    """Damage a record: replace its text, or edit its JSON with `change`."""
    if text is not None:
        path.write_text(text)
    else:
        edit_json(path, change)


def _drop_counts(r):  # the seal would tell: a record without one (as before seals) is read
    del r["counts"], r[SEAL]


def _tokens_as_text(r):
    r["counts"]["splits"]["train"]["tokens"] = str(r["counts"]["splits"]["train"]["tokens"])
    del r[SEAL]


def _one_more_record(r):  # still JSON, still its shape: only the seal tells
    r["counts"]["records_read"] += 1


@pytest.mark.parametrize("text,change,says", [
    ("{not json", None, "not JSON"),
    slow("", None, "not JSON"),
    slow("[1, 2]", None, "not a JSON object"),
    slow(None, _drop_counts, "no counts"),
    slow(None, _tokens_as_text, "counts.splits.train.tokens is"),
    (None, _one_more_record, "does not match its sha256"),
])
def test_a_damaged_done_json_is_one_line_and_its_task_re_run_mends_it(
        made, tmp_path, text, change, says):
    out = copy_of(made, "placed", tmp_path)
    path = work(out, "task.00001/done.json")
    spoil(path, text, change)
    message = one_line_error(["merge", str(out)])
    assert str(path) in message and says in message and task_named(message) == 1, message
    r = CliRunner().invoke(pack, ["stats", str(out)])  # no traceback there either
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    rerun_and_merge(made, out, 1)


def test_another_task_s_done_json_is_refused(made, tmp_path):
    out = copy_of(made, "placed", tmp_path)
    shutil.copy(work(out, "task.00000/done.json"), work(out, "task.00002/done.json"))
    message = one_line_error(["merge", str(out)])
    assert "the record of task 0 of 3, not of task 2 of 3" in message, message
    rerun_and_merge(made, out, task_named(message))


def test_a_done_json_from_before_checksums_is_merged_on_its_sizes(made, tmp_path):
    out = copy_of(made, "unplaced", tmp_path)
    for i in range(TASKS):
        edit_json(work(out, f"task.{i:05d}/done.json"),
                  lambda r: [r.pop(k) for k in ("files", "block_bytes", SEAL)])
    r = CliRunner().invoke(pack, ["merge", str(out)])
    assert r.exit_code == 0, r.output
    assert build_tree(out) == made["want"]


def _other_shards(r):
    r.pop(SEAL)
    r["train"].pop(sorted(r["train"])[0])


def _flip_a_hash(r):
    entry = next(iter(r["train"].values()))
    h = entry["zip_data"]["hashes"]["sha256"]
    entry["zip_data"]["hashes"]["sha256"] = ("0" if h[0] != "0" else "1") + h[1:]


@pytest.mark.parametrize("text,change,says", [
    ("{\"train\": {", None, "not JSON"),
    slow('{"train": 5, "val": {}}', None, "train is 5, not dict"),
    slow(None, _other_shards, "it lists other train shards than the"),
    (None, _flip_a_hash, "does not match its sha256"),
])
def test_a_damaged_placed_json_is_one_line_and_its_task_re_run_mends_it(
        made, tmp_path, text, change, says):
    out = copy_of(made, "placed", tmp_path)
    path = work(out, "task.00000/placed.json")
    spoil(path, text, change)
    message = one_line_error(["merge", str(out)])
    assert str(path) in message and says in message and task_named(message) == 0, message
    rerun_and_merge(made, out, 0)


@pytest.mark.parametrize("name", ["tasks.json", slow("fingerprint.json")])
def test_a_damaged_build_record_is_one_line_and_any_task_re_run_mends_it(made, tmp_path, name):
    out = copy_of(made, "placed", tmp_path)
    path = work(out, name)
    path.write_text(path.read_text()[:40])
    message = one_line_error(["merge", str(out)])
    assert str(path) in message and "not JSON" in message, message
    assert "re-run one of the build's tasks to write it again" in message, message
    rerun_and_merge(made, out, 2)


# -- 3. a placed shard removed or cut: no loop -------------------------------------------------------

@pytest.mark.parametrize("how,mend", [("removed", "task"), slow("cut", "task"),
                                      slow("removed", "merge --task-index"),
                                      ("cut", "merge --task-index")])
@pytest.mark.slow
def test_a_placed_shard_removed_names_its_task_whose_re_run_places_it_again(
        made, tmp_path, how, mend):
    out = copy_of(made, "placed", tmp_path)
    shard = sorted(work(out, "task.00001/train").iterdir())[2]
    if how == "removed":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:-1])
    message = one_line_error(["merge", str(out)])
    assert str(shard) in message and task_named(message) == 1, message
    assert not (out / "train").exists(), "a refused merge moves nothing"
    assert one_line_error(["merge", str(out)]) == message  # the same, until the task is re-run
    if mend == "task":
        rerun_and_merge(made, out, 1)
    else:
        r = CliRunner().invoke(pack, ["merge", str(out), "--task-index", "1"])
        assert r.exit_code == 0 and "600 documents" in r.output, r.output
        assert build_tree(out) == made["want"]


@pytest.mark.slow
def test_a_placed_shard_with_a_byte_changed_is_placed_again_by_its_task(made, tmp_path):
    """The merge only stats placed shards (their sha256 is in the index, which `pack stats
    --verify` checks); a task run again checks their bytes too."""
    out = copy_of(made, "placed", tmp_path)
    shard = sorted(work(out, "task.00001/train").iterdir())[2]
    flip(shard, 20)
    rerun_and_merge(made, out, 1)
    r = CliRunner().invoke(pack, ["stats", str(out), "--verify"])
    assert r.exit_code == 0, r.output


# -- 4. the single-machine build meets a damaged record of a tasked build -------------------------

@pytest.mark.slow
def test_a_single_build_over_a_damaged_tasked_build_is_one_line(made, tmp_path):
    out = copy_of(made, "placed", tmp_path)
    work(out, "tasks.json").write_text("{cut")
    with pytest.raises(SettingsError) as e:  # the single-machine Build itself: never resumes it
        build(settings(out, made), show_progress=False)
    assert f"whose {work(out, 'tasks.json')} is damaged" in str(e.value)
    # the command goes on as tasks (tasks.json written again): the single build's bytes
    r = CliRunner().invoke(pack, ["build", *to_flags(settings(out, made))])
    assert r.exit_code == 0, r.output
    assert build_tree(out) == made["want"]
    work(out, "fingerprint.json").parent.mkdir()
    work(out, "fingerprint.json").write_text("[not a build")
    r = CliRunner().invoke(pack, ["build", *to_flags(settings(out, made)), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert build_tree(out) == made["want"]


def test_a_damaged_fingerprint_of_an_unfinished_build_is_one_line(made, tmp_path):
    out = tmp_path / "out"
    cfg = settings(out, made)
    (out / WORK_DIR).mkdir(parents=True)
    work(out, "fingerprint.json").write_text("{cut")
    message = one_line_error(["build", *to_flags(cfg)])
    assert f"{work(out, 'fingerprint.json')} is damaged (not a JSON object)" in message, message
    r = CliRunner().invoke(pack, ["build", *to_flags(cfg), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert build_tree(out) == made["want"]


@pytest.mark.parametrize("index", [-1, -3, 3, 7])
def test_merge_of_a_task_index_no_task_has_is_one_line(made, tmp_path, index):
    """-1 used to end in an IndexError; 7 was "7 of its 3 tasks are not done (task 1, ..., 7)"."""
    out = copy_of(made, "unplaced", tmp_path)
    assert one_line_error(["merge", str(out), f"--task-index={index}"]) == (
        f"Error: --task-index {index} is not a task of {out}'s {TASKS} (0 to {TASKS - 1})")


def test_merge_of_a_missing_folder_makes_no_folder(tmp_path):
    gone = tmp_path / "no" / "such" / "out"
    assert "holds no build split into tasks" in one_line_error(["merge", str(gone)])
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("make", ["a file", "work folder a file", "tasks.json a folder"])
def test_merge_of_a_path_that_holds_no_tasks_is_one_line(tmp_path, make):
    """Each was a NotADirectoryError or IsADirectoryError traceback."""
    out = tmp_path / "out"
    if make == "a file":
        out.write_text("a user's file")
    elif make == "work folder a file":
        out.mkdir()
        (out / WORK_DIR).write_text("")
    else:
        (out / WORK_DIR / "tasks.json").mkdir(parents=True)
    line = one_line_error(["merge", str(out)])
    assert ("tasks.json: a folder, not a file" if make == "tasks.json a folder"
            else "holds no build split into tasks") in line, line
    if make == "a file":
        assert out.read_text() == "a user's file"
