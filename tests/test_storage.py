"""longpack/core/store.py against a real S3 server (moto's, on 127.0.0.1) and fsspec's memory://."""

import pytest

from longpack.core.store import StorageError, Store, is_url, redact, refuse_unwritable


def test_a_store_writes_lists_reads_and_removes(s3, tmp_path):
    store = Store(s3.url("data/"))
    assert store.sizes() == {}  # an empty prefix is no error
    store.write_bytes("a/b.txt", b"hello")
    (tmp_path / "c.bin").write_bytes(b"x" * 1000)
    store.put_file(tmp_path / "c.bin", "c.bin")
    assert store.sizes() == {"a/b.txt": 5, "c.bin": 1000}
    assert s3.keys() == {"data/a/b.txt": 5, "data/c.bin": 1000}
    assert store.size("c.bin") == 1000 and store.size("nothing") is None
    assert store.read_bytes("a/b.txt") == b"hello"
    with store.open("c.bin") as f:
        f.seek(990)
        assert f.read() == b"x" * 10
    store.get_file("a/b.txt", tmp_path / "got")
    assert (tmp_path / "got").read_bytes() == b"hello"
    store.remove(["a/b.txt"])
    assert store.sizes() == {"c.bin": 1000}


def _one_line(caught) -> str:
    text = str(caught.value)
    assert "\n" not in text and "testing" not in text  # never a credential
    return text


@pytest.mark.slow
def test_missing_bucket_wrong_endpoint_and_no_credentials_are_one_line_each(s3, monkeypatch):
    with pytest.raises(StorageError) as caught:
        Store("s3://no-such-bucket/x").check_writable()
    assert _one_line(caught) == (
        f"cannot list s3://no-such-bucket/x: the bucket no-such-bucket does not exist at the "
        f"endpoint {s3.endpoint}; create it or correct the URL")

    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on port 9
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # one try says it: botocore's retries back off ~5 s
    with pytest.raises(StorageError) as caught:
        Store(s3.url("x")).check_writable()
    assert _one_line(caught).startswith(
        f"cannot list {s3.url('x')}: the endpoint http://127.0.0.1:9 cannot be reached")
    assert "S3_ENDPOINT_URL / AWS_ENDPOINT_URL" in str(caught.value)

    monkeypatch.setenv("S3_ENDPOINT_URL", s3.endpoint)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(StorageError) as caught:
        Store(s3.url("x")).check_writable()
    assert _one_line(caught).startswith(f"cannot list {s3.url('x')}: no credentials found; set "
                                        "AWS_ACCESS_KEY_ID")


def test_memory_store_is_the_same_layer():
    store = Store("memory://longpack-test-store")
    store.write_bytes("x/y", b"1")
    assert store.sizes() == {"x/y": 1} and store.read_bytes("x/y") == b"1"
    store.remove(["x/y"])


def test_urls_schemes_and_redaction():
    assert is_url("s3://b/p") and is_url("gs://b") and not is_url("./out") and not is_url("/a/b")
    assert redact("cannot reach http://user:secret@host:9/x") == "cannot reach http://host:9/x"
    for url in ("s3://b/p", "gs://b/p", "memory://p"):
        refuse_unwritable(url, "pack build")
    with pytest.raises(StorageError, match=r"pack build cannot write to https://h/x: https:// is"):
        refuse_unwritable("https://h/x", "pack build")


def test_a_store_whose_library_is_missing_names_the_extra():
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed here")
    except ImportError:
        pass
    with pytest.raises(StorageError) as caught:
        Store("gs://bucket/x")
    # by the package's name: longpack installed from a clone is not on the package index
    assert str(caught.value) == ("gs://bucket/x: gs:// needs gcsfs (ImportError); pip install "
                                 "'gcsfs>=2024.2' (the extra [gcs])")


@pytest.mark.slow
def test_aws_endpoint_url_names_the_server_as_s3_endpoint_url_does(s3, monkeypatch):
    monkeypatch.delenv("S3_ENDPOINT_URL")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    store = Store(s3.url("aws-variable"))
    store.write_bytes("x", b"1")
    assert s3.keys("aws-variable/") == {"aws-variable/x": 1}
