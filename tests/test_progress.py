
from longpack.pipeline.manifest import summary
from longpack.pipeline.progress import Progress


def test_progress_line_shows_rates_and_eta(capsys):
    p = Progress(total_bytes=1000, max_tokens=None, enabled=True)
    p.start -= 10  # ten seconds in
    p.last = 0
    p.update(docs=2000, tokens=3_000_000, bytes_done=250)
    line = capsys.readouterr().err
    assert "2.00k docs (200/s)" in line and "3.00M tokens (300.00k/s)" in line
    assert "25.0%" in line and "ETA 0:00:30" in line


def test_progress_is_silent_off_a_terminal(capsys):
    p = Progress(total_bytes=None, max_tokens=None, enabled=False)
    p.last = 0
    p.update(1, 1, 0)
    p.close()
    assert capsys.readouterr().err == ""


def test_summary_fits_one_screen_and_names_the_skip_log(tmp_path):
    m = {"format": "mds", "seq": 8, "dtype": "uint16", "tokenizer": {"name": "gpt2"},
         "inputs": [{"size": 10}], "skipped_log": "skipped.jsonl",
         "counts": {"records_read": 3, "documents": 2, "tokens": 9,
                    "skipped": {"bad_json": 1, "empty": 0}},
         "splits": {s: {"documents": 1, "tokens": 4, "rows": 1, "shards": 1, "bytes": 50,
                        "padding_tokens": 4, "dropped_tokens": 0} for s in ("train", "val")},
         "timings": {"seconds": 1.5, "steady_tokens_per_second": 2e6, "resumed": False}}
    text = summary(m, str(tmp_path))
    assert len(text.splitlines()) <= 24
    assert "bad_json 1" in text and "empty" not in text and "skipped.jsonl" in text
    assert "2.00 M tokens/s" in text


def test_a_resumed_build_times_only_this_runs_work(capsys):
    """Half the input was done by an earlier run; this run did 10% more in 10 s: 40% are left,
    which take 40 s at this run's rate (not 10 s x 0.4 / 0.6 from the whole 60%)."""
    p = Progress(total_bytes=1000, max_tokens=None, enabled=True, done=(500, 1_000_000, 500))
    p.start -= 10
    p.last = 0
    p.update(docs=600, tokens=1_200_000, bytes_done=600)
    line = capsys.readouterr().err
    assert "60.0%" in line and "ETA 0:00:40" in line
    assert "600 docs (10/s)" in line and "(20.00k/s)" in line


def test_one_big_file_moves_the_progress_before_it_ends(tmp_path, monkeypatch, byte_tokenizer):
    import numpy as np

    import longpack.pipeline.build as build_mod
    import longpack.pipeline.read.batches as batches
    from conftest import make_texts, write_jsonl
    from longpack.pipeline.config import BuildConfig

    seen = []

    class Recorded(Progress):
        def update(self, docs, tokens, bytes_done):
            seen.append(bytes_done)
            super().update(docs, tokens, bytes_done)

    monkeypatch.setattr(build_mod, "Progress", Recorded)
    monkeypatch.setattr(batches, "BATCH_DOCS", 100)
    rng = np.random.default_rng(0)
    path = write_jsonl(tmp_path / "one.jsonl.gz",
                       [{"text": t + rng.bytes(200).hex()} for t in make_texts(2000)], "gz")
    build_mod.build(BuildConfig(out=str(tmp_path / "out"), dataset="jsonl", inputs=(str(path),),
                                tokenizer=byte_tokenizer, seq=256, workers=1),
                    show_progress=False)
    size = path.stat().st_size
    inside = [b for b in seen if 0 < b < size]
    assert len(inside) >= 10 and seen == sorted(seen) and seen[-1] == size
