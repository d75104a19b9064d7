"""Training on a mixture of builds (issue 18): the order (shares per batch, stages, epochs,
O(1) positioning), the settings, and runs through `train` (resume, refusals, metrics)."""

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import small_build, write_byte_tokenizer_json
from longpack.core.errors import DataError, SettingsError, TrainingError
from longpack.pipeline.mixture import parse_sources, parse_stage, parse_weights
from longpack.training.cli import train as train_cli
from longpack.training.config import TrainConfig
from longpack.training.data.mixture import GlobalOrder, MixedOrder, batch_hash

FP = ["a" * 16, "b" * 16, "c" * 16]


# The sampler and the settings are pure units: this module imports torch only for the tests
# that train (longpack.training.loop and test_train import it).

def train(*args, **kw):
    from longpack.training.loop import train

    return train(*args, **kw)


def weights(run):
    from test_train import weights

    return weights(run)


def config(shards, out, **kw):
    """test_train's settings (neox-tiny, batch 4, 8 steps) on one build or several."""
    base = dict(model="neox-tiny", out=str(out), batch_size=4, max_steps=8, warmup=2, lr=3e-3,
                save_every=3, log_every=100, workers=0)
    return TrainConfig(shards=tuple(map(str, shards)), **{**base, **kw})


def source_of(order: MixedOrder, rows: np.ndarray) -> np.ndarray:
    return np.searchsorted(order.bases, rows, side="right") - 1


def test_every_batch_holds_the_shares_up_to_rounding_and_the_totals_stay_exact():
    shares, G = np.array([0.5, 0.3, 0.2]), 16
    order = MixedOrder([(1000, FP[0]), (100, FP[1]), (37, FP[2])], [(0, shares)], G, seed=0)
    drawn = np.zeros(3, np.int64)
    for step in range(10_000):
        counts = np.bincount(source_of(order, order.step_rows(step)), minlength=3)
        assert counts.sum() == G
        assert (np.floor(shares * G) <= counts).all() and (counts <= np.ceil(shares * G)).all()
        drawn += counts
        assert np.abs(drawn - shares * G * (step + 1)).max() < 2  # rows, over any prefix
        assert (order.rows_before(step + 1) == drawn).all()
    # O(1) positioning: a billion steps on, the totals still follow the shares
    far = order.rows_before(10**9)
    assert far.sum() == G * 10**9
    assert np.allclose(far / (G * 10**9), shares, rtol=1e-4)


def test_each_source_goes_through_every_row_once_per_epoch():
    order = MixedOrder([(1000, FP[0]), (100, FP[1])], [(0, np.array([0.5, 0.5]))], 8, seed=3)
    small = [r - order.bases[1] for s in range(60)
             for r in order.step_rows(s) if source_of(order, np.array([r]))[0] == 1]
    small = sorted(small[:100]), sorted(small[100:200])
    assert small[0] == list(range(100)) and small[1] == list(range(100))  # epochs 0 and 1
    # 4 rows a step of a 10x smaller source: 0.04 epochs a step, counted as such
    assert order.epochs_before(50) == pytest.approx([200 / 1000, 200 / 100])


@pytest.mark.slow
def test_a_step_is_the_same_however_it_is_reached():
    """Steps are drawn a block at a time: a step asked for alone, far on or at a block's edge,
    holds what the run reaching it in turn gives, and source k's rows in it are the next ones of
    its own order."""
    sources, G = [(1000, FP[0]), (100, FP[1]), (37, FP[2])], 16
    stages = [(0, np.array([0.5, 0.3, 0.2])), (1030, np.array([0.1, 0.0, 0.9]))]
    in_turn = MixedOrder(sources, stages, G, seed=4)
    own = [GlobalOrder(n, G, 4, fp) for n, fp in sources]
    for step in range(1000, 1100):  # across a block's end (4096 rows) and the stage at 1030
        rows = in_turn.step_rows(step)
        alone = MixedOrder(sources, stages, G, seed=4)
        assert np.array_equal(alone.step_rows(step), rows)
        assert alone.step_hash(step) == in_turn.step_hash(step)
        first, after = in_turn.rows_before(step), in_turn.rows_before(step + 1)
        for k, order in enumerate(own):
            mine = rows[source_of(in_turn, rows) == k] - in_turn.bases[k]
            assert sorted(mine) == sorted(order.rows(first[k], after[k] - first[k]))
    far = MixedOrder(sources, stages, G, seed=4)
    assert np.array_equal(far.step_rows(10**7 + 3), in_turn.step_rows(10**7 + 3))
    assert not np.array_equal(in_turn.step_rows(5), MixedOrder(sources, stages, G, 5).step_rows(5))


def test_one_source_is_the_single_build_order():
    order = MixedOrder([(1000, FP[0])], [(0, np.array([1.0]))], 16, seed=5)
    single = GlobalOrder(1000, 16, seed=5, fingerprint=FP[0])
    for step in (0, 1, 62, 63, 500):
        assert np.array_equal(order.step_rows(step), single.step_rows(step))
        assert order.step_hash(step) == batch_hash(single.step_rows(step))


def test_a_stage_changes_only_the_steps_from_its_start():
    one = MixedOrder([(1000, FP[0]), (300, FP[1])], [(0, np.array([0.7, 0.3]))], 10, seed=0)
    two = MixedOrder([(1000, FP[0]), (300, FP[1])],
                     [(0, np.array([0.7, 0.3])), (40, np.array([0.2, 0.8]))], 10, seed=0)
    for step in range(40):
        assert np.array_equal(one.step_rows(step), two.step_rows(step))
        assert one.step_hash(step) == two.step_hash(step)
    counts = np.bincount(source_of(two, two.step_rows(40)), minlength=2)
    assert counts.tolist() == [2, 8]
    # positioning across the stage: rows before step 100 = 40 steps at 7/3 + 60 at 2/8
    assert two.rows_before(100).tolist() == [40 * 7 + 60 * 2, 40 * 3 + 60 * 8]


def test_steps_do_not_depend_on_the_order_sources_are_listed_in():
    # 0.3 x 64 = 19.2: the extra rows go now to one source, now to the other
    a = MixedOrder([(1000, FP[0]), (300, FP[1])], [(0, np.array([0.3, 0.7]))], 64, seed=0)
    b = MixedOrder([(300, FP[1]), (1000, FP[0])], [(0, np.array([0.7, 0.3]))], 64, seed=0)
    for step in range(50):
        assert a.step_hash(step) == b.step_hash(step) != a.step_hash(step + 1)
        # the same (build, row) at each position of the step
        in_a = [(FP[k], r - a.bases[k]) for r, k in
                zip(a.step_rows(step), source_of(a, a.step_rows(step)))]
        in_b = [(FP[1 - k], r - b.bases[k]) for r, k in
                zip(b.step_rows(step), source_of(b, b.step_rows(step)))]
        assert in_a == in_b


def test_a_stage_that_repeats_the_shares_before_it_changes_nothing():
    sources, shares = [(1000, FP[0]), (300, FP[1])], np.array([0.3, 0.7])
    one = MixedOrder(sources, [(0, shares)], 64, seed=0)
    two = MixedOrder(sources, [(0, shares), (10, shares.copy())], 64, seed=0)
    assert all(one.step_hash(s) == two.step_hash(s) for s in range(100))
    assert one.history == two.history


def test_max_epochs_cuts_the_run_before_a_source_repeats():
    order = MixedOrder([(1000, FP[0]), (100, FP[1])], [(0, np.array([0.5, 0.5]))], 8, seed=0,
                       max_epochs=[None, 2])
    assert order.last_step(1000) == (50, 1)  # 4 rows a step of 100: 200 rows after 50 steps
    assert order.last_step(30) == (30, None)


def test_the_settings_name_sources_and_check_shares():
    assert parse_sources(["web=./fw", "s3://bucket/code", "./x/books/"]) == [
        ("web", "./fw"), ("code", "s3://bucket/code"), ("books", "./x/books/")]
    assert parse_weights("web=7,code=3", ["web", "code", "books"]) == {
        "web": 0.7, "code": 0.3, "books": 0.0}
    stage = parse_stage("90%:books=1", ["web", "books"])
    assert stage.start_step(1000, 500) == 450 and stage.weights == {"web": 0.0, "books": 1.0}
    assert parse_stage("2e6tok:web=1", ["web"]).start_step(1000, 5) == 2000
    # exact: k% of 100 or 200 steps is step k or 2k (0.07 * 100 is 7.000000000000001 in floats)
    assert all(parse_stage(f"{k}%:web=1", ["web"]).start_step(1, steps) == k * steps // 100
               for k in range(101) for steps in (100, 200))
    assert parse_weights("web=1e308,code=1e308", ["web", "code"]) == {"web": 0.5, "code": 0.5}
    for bad, says in [(dict(mix="web=1,cod=1"), "no source is named 'cod'"),
                      (dict(mix="web=-1"), "a weight is a number >= 0"),
                      (dict(mix="web=0"), "at least one weight"),
                      (dict(mix_stages=("soon:web=1",)), "START a step"),
                      (dict(mix_stages=("1e400:web=1",)), "START a step"),
                      (dict(max_epochs=("code=0",)), "above 0"),
                      (dict(shards=("a=./x", "a=./y")), "two sources are named 'a'")]:
        with pytest.raises(SettingsError, match=says):
            shards = bad.pop("shards", ("web=./fw", "code=./c"))
            config(shards, "run", **bad)


# -- through `train` ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_builds_once(tmp_path_factory):
    """The two builds of `two_builds`, made once for the module: read them, never change them."""
    tmp = tmp_path_factory.mktemp("mixture")
    tokenizer = str(write_byte_tokenizer_json(tmp / "bytes-tokenizer.json"))  # trains fast
    return (small_build(tmp, tokenizer, "web", 200, seed=1),
            small_build(tmp, tokenizer, "code", 30, seed=2))


@pytest.fixture
def two_builds(tmp_path, two_builds_once):
    """This test's copies of web (200 documents) and code (30), byte-tokenized (a vocabulary of
    257: conftest.write_byte_tokenizer_json)."""
    return tuple(Path(shutil.copytree(b, tmp_path / b.name)) for b in two_builds_once)


def mixed(builds, out, **kw):
    web, code = builds
    return config((f"web={web}", f"code={code}"), out, **{"mix": "web=0.75,code=0.25", **kw})


@pytest.mark.slow
def test_a_mixed_run_resumes_exactly_and_counts_each_source(tmp_path, two_builds):
    straight = train(mixed(two_builds, tmp_path / "a", eval_every=4), log=lambda m: None)
    a = weights(tmp_path / "a")
    for stop in sorted(random.Random(18).sample(range(1, 8), 2)):  # resume at random steps
        run = tmp_path / f"stop-{stop}"
        train(mixed(two_builds, run, eval_every=4, save_every=100), log=lambda m: None,
              stop_at=stop)
        resumed = train(mixed(two_builds, run, eval_every=4), log=lambda m: None)
        assert [h["batch"] for h in straight] == [h["batch"] for h in resumed]
        assert [h["loss"] for h in straight] == [h["loss"] for h in resumed]
        b = weights(run)
        assert all((a[k] == b[k]).all() for k in a)
    last = straight[-1]  # batch 4: 3 rows of web and 1 of code each step, 8 steps
    assert (last["rows/web"], last["rows/code"]) == (24, 8)
    assert last["tokens/web"] == 24 * 64 and last["tokens/web"] + last["tokens/code"] == last["tokens"]
    assert last["epochs/code"] == pytest.approx(8 / json.loads(
        (two_builds[1] / "manifest.json").read_text())["splits"]["train"]["rows"])
    assert {"val_loss/web", "val_loss/code", "val_loss"} <= set(straight[3])
    lo, hi = sorted([straight[3]["val_loss/web"], straight[3]["val_loss/code"]])
    assert lo <= straight[3]["val_loss"] <= hi  # over both sources' targets


@pytest.mark.slow
def test_a_resume_refuses_another_mixture_but_takes_a_new_stage_at_its_step(tmp_path, two_builds):
    train(mixed(two_builds, tmp_path / "r"), log=lambda m: None, stop_at=4)
    with pytest.raises(TrainingError, match="another mixture before its step 4"):
        train(mixed(two_builds, tmp_path / "r", mix="web=0.5,code=0.5"), log=lambda m: None)
    with pytest.raises(TrainingError, match="another mixture"):
        train(mixed(two_builds, tmp_path / "r", mix_stages=("2:code=1",)), log=lambda m: None)
    history = train(mixed(two_builds, tmp_path / "r", mix_stages=("4:code=1",)),
                    log=lambda m: None)  # an annealing stage from the resume step on
    assert [h["rows/web"] for h in history] == [3, 6, 9, 12, 12, 12, 12, 12]


@pytest.mark.slow
def test_a_stage_leaves_the_steps_before_it_as_the_single_stage_run(tmp_path, two_builds):
    one = train(mixed(two_builds, tmp_path / "one"), log=lambda m: None)
    staged = train(mixed(two_builds, tmp_path / "two", mix_stages=("50%:web=1",)),
                   log=lambda m: None)
    assert [h["batch"] for h in one[:4]] == [h["batch"] for h in staged[:4]]
    assert [h["loss"] for h in one[:4]] == [h["loss"] for h in staged[:4]]
    assert staged[-1]["rows/code"] == staged[3]["rows/code"]  # from step 4: web only


def test_a_mixture_of_tokenizers_or_lengths_is_one_line(tmp_path, byte_tokenizer,
                                                        byte_tokenizer_u32):
    web = small_build(tmp_path, byte_tokenizer, "web", 40, seed=1)
    other = small_build(tmp_path, byte_tokenizer_u32, "other", 40, seed=2)
    longer = small_build(tmp_path, byte_tokenizer, "longer", 40, seed=3, seq=129)
    with pytest.raises(DataError, match="web and other were tokenized differently"):
        train(config((str(web), str(other)), tmp_path / "x"), log=lambda m: None)
    with pytest.raises(DataError, match="web has rows of 65 tokens and longer of 129"):
        train(config((str(web), str(longer)), tmp_path / "y"), log=lambda m: None)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.slow
def test_max_epochs_stops_the_run_and_the_dry_run_says_what_each_source_gives(
        tmp_path, two_builds):
    web = two_builds[0]
    tokenizer = str(write_byte_tokenizer_json(tmp_path / "bytes-tokenizer.json"))  # web's
    code = small_build(tmp_path, tokenizer, "tiny", 2, seed=4)  # a few rows
    code_rows = json.loads((code / "manifest.json").read_text())["splits"]["train"]["rows"]
    assert 80 / code_rows > 4  # the 80 rows the dry run draws of code repeat it past 4 epochs
    args = ["--shards", f"web={web}", "--shards", f"code={code}", "--mix", "web=1,code=1",
            "--batch-size", "4", "--max-steps", "40", "--warmup", "1", "--model", "neox-tiny",
            "--workers", "0", "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(train_cli, [*args, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert f"code: {80 * 64:,} tokens (80 rows), {80 / code_rows:.2f} epochs" in result.output
    assert "code is repeated" in result.output  # more than 4 epochs of a small source
    result = CliRunner().invoke(train_cli, [*args, "--max-epochs", "code=1"])
    assert result.exit_code == 0, result.output
    assert f"code reaches --max-epochs at step {code_rows // 2}" in result.output
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == code_rows // 2 and json.loads(lines[-1])["rows/code"] <= code_rows


def test_stages_and_sources_that_cannot_be_drawn_are_one_line(tmp_path, two_builds):
    web, code = two_builds
    for kw, says in [
            (dict(mix_stages=("8:code=1",)), r"8: starts at step 8, and the run has 8 steps"),
            (dict(mix_stages=("1e40tok:code=1",)), "it would never be drawn"),
            (dict(mix_stages=("0:code=1", "0%:web=1")), "two stages start at step 0"),
            (dict(shards=(f"web={web}", f"again={web}")), "web and again are the same build"),
            (dict(max_epochs=("web=0.001",)), "web reaches it at step 0, before any step")]:
        shards = kw.pop("shards", (f"web={web}", f"code={code}"))
        with pytest.raises((DataError, SettingsError), match=says):
            train(config(shards, tmp_path / "x", **kw), log=lambda m: None)
        assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_a_resume_past_a_lowered_max_epochs_is_refused_and_a_finished_one_is_complete(
        tmp_path, two_builds):
    rows = json.loads((two_builds[1] / "manifest.json").read_text())["splits"]["train"]["rows"]
    run = mixed(two_builds, tmp_path / "r", max_steps=rows)  # 1 row of code a step
    train(run, log=lambda m: None, stop_at=4)
    with pytest.raises(DataError, match="code reaches it at step 2, and the run is at step 4"):
        train(mixed(two_builds, tmp_path / "r", max_steps=rows, max_epochs=(f"code={2 / rows}",)),
              log=lambda m: None)
    said = []
    train(mixed(two_builds, tmp_path / "r", max_steps=rows, max_epochs=(f"code={4 / rows}",)),
          log=said.append)
    assert "code reached --max-epochs at step 4: the run is complete" in said


@pytest.mark.slow
def test_a_config_files_data_list_is_the_flags(tmp_path, two_builds):
    web, code = two_builds
    (tmp_path / "c.toml").write_text(
        f'model = "neox-tiny"\nbatch_size = 4\nmax_steps = 2\nwarmup = 1\nworkers = 0\n'
        f'out = "{tmp_path / "run"}"\nmix_stages = ["1:code=1"]\n'
        f'[[data]]\nname = "web"\npath = "{web}"\nweight = 0.75\n'
        f'[[data]]\npath = "{code}"\nweight = 0.25\nmax_epochs = 3\n')
    result = CliRunner().invoke(train_cli, ["--config", str(tmp_path / "c.toml")])
    assert result.exit_code == 0, result.output
    first, second = [json.loads(x) for x in
                     (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert (first["rows/web"], first["rows/code"]) == (3, 1)
    assert (second["rows/web"], second["rows/code"]) == (3, 5)
    (tmp_path / "bad.toml").write_text(f'[[data]]\npath = "{web}"\nshare = 1\n')
    result = CliRunner().invoke(train_cli, ["--config", str(tmp_path / "bad.toml")])
    assert result.exit_code != 0 and "unknown share" in result.output
    (tmp_path / "bad.toml").write_text(f'[[data]]\nname = "a=b"\npath = "{web}"\n')
    result = CliRunner().invoke(train_cli, ["--config", str(tmp_path / "bad.toml")])
    assert result.exit_code != 0 and "its name 'a=b' has characters" in result.output


@pytest.mark.slow  # two runs, one through S3: mixtures and runs from a bucket each have quick tests
def test_a_source_in_a_bucket_mixes_with_a_local_one(tmp_path, two_builds, s3):
    web, code = two_builds
    remote = s3.upload_tree(code, "builds/code")  # a real S3 server on 127.0.0.1
    local = train(config((f"web={web}", f"code={code}"), tmp_path / "a", mix="web=3,code=1",
                         max_steps=3), log=lambda m: None)
    mixed_remote = train(config((f"web={web}", remote), tmp_path / "b", mix="web=3,code=1",
                                max_steps=3), log=lambda m: None)  # named by its URL's folder
    assert [h["batch"] for h in mixed_remote] == [h["batch"] for h in local]
    assert [h["loss"] for h in mixed_remote] == [h["loss"] for h in local]
    assert mixed_remote[-1]["rows/code"] == 3
