
from pipeline.manifest import summary
from pipeline.progress import Progress


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
    text = summary(m, tmp_path)
    assert len(text.splitlines()) <= 24
    assert "bad_json 1" in text and "empty" not in text and "skipped.jsonl" in text
    assert "2.00 M tokens/s" in text
