"""Object storage: the one layer every URL goes through (build inputs: read/remote_inputs.py; build
outputs: store/remote_build.py + store/uploader.py; `pack stats`: stats/remote.py; the trainer's
shards: pipeline/builds/reader.py, and checkpoints: training/checkpoints/upload.py). Local paths
never come here.

    store = Store("s3://bucket/prefix")        # fsspec: s3fs, gcsfs, adlfs, memory, ...
    store.put_file(Path("shard.00000.mds.zstd"), "train/shard.00000.mds.zstd")
    store.sizes()                               # {"train/shard.00000.mds.zstd": 67108864, ...}

Why fsspec: it is what pyarrow, Hugging Face datasets and most of this field read object
stores with, one API over S3, GCS, Azure and an in-memory store (what the gs:// tests use),
with range reads (a parquet file is read a row group at a time, never downloaded whole).

Endpoint and credentials come from the environment only (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...;
S3_ENDPOINT_URL, mosaicml-streaming's variable, or AWS_ENDPOINT_URL for an S3-compatible
server). The cloud libraries are extras (s3, gcs, azure in pyproject.toml); a missing one, missing
credentials, an unreachable endpoint, a missing bucket or a refused request each end in one
StorageError line naming the URL and what to do. Nothing here ever prints a credential: errors
carry URLs with any user:password@ part cut out.
"""

import contextlib
import hashlib
import os
import re
from pathlib import Path

from longpack.core.errors import StorageError, install_hint

# protocol -> (the extra that provides it, the library) for the stores a build writes to
WRITABLE = {"s3": ("s3", "s3fs"), "gs": ("gcs", "gcsfs"), "gcs": ("gcs", "gcsfs"),
            "az": ("azure", "adlfs"), "abfs": ("azure", "adlfs"), "memory": (None, "fsspec")}
_URL = re.compile(r"([a-z][a-z0-9+.-]*)://(.*)", re.IGNORECASE)


def is_url(location) -> bool:
    return isinstance(location, str) and _URL.fullmatch(location) is not None


def redact(text: str) -> str:
    """`text` with the user:password@ part of every URL in it cut out."""
    return re.sub(r"(://)[^/@\s]*@", r"\1", text)


def endpoint() -> str | None:
    """The S3-compatible endpoint the environment names (None: AWS itself)."""
    return os.environ.get("S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")


def protocol(url: str) -> str:
    return _URL.fullmatch(url).group(1).lower()


def staging_folder(url: str, base: str | None = None) -> Path:
    """The local folder where what goes to `url` is staged (a build's files, a run's
    checkpoints): under `base` (--staging), else the user's cache; one per URL."""
    root = Path(base) if base else Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longpack" / "staging"
    return root / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]


def refuse_unwritable(url: str, what: str) -> None:
    """Up front, before anything is read: a URL scheme `what` cannot write to."""
    scheme = protocol(url)
    if scheme not in WRITABLE:
        known = ", ".join(f"{p}://" for p in WRITABLE if p != "memory")
        raise StorageError(f"{what} cannot write to {redact(url)}: {scheme}:// is not a store "
                           f"it writes to ({known}, or a local path)")


def filesystem(url: str):
    """(fsspec filesystem, path inside it) for `url`; StorageError when its library is missing."""
    try:
        import fsspec
    except ImportError:
        raise StorageError(f"{redact(url)} needs fsspec: {install_hint('s3')}") from None
    scheme = protocol(url)
    options = {}
    if scheme == "s3" and endpoint():
        options["client_kwargs"] = {"endpoint_url": endpoint()}
    try:
        fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True, **options)
    except (ImportError, ValueError) as e:
        extra, library = WRITABLE.get(scheme, (None, None))
        hint = (install_hint(extra) if extra else
                f"install the fsspec implementation of {scheme}://" if library is None else
                f"pip install {library}")
        raise StorageError(f"{redact(url)}: {scheme}:// needs {library or 'a library'} "
                           f"({type(e).__name__}); {hint}") from None
    return fs, path.rstrip("/")


@contextlib.contextmanager
def storage_errors(url: str, doing: str):
    """Any failure of the store inside becomes one StorageError line about `url`."""
    try:
        yield
    except StorageError:
        raise
    except Exception as e:
        raise StorageError(explain(e, url, doing)) from None


def explain(e: Exception, url: str, doing: str) -> str:
    """One line for a store's error: what failed, where, and what to do."""
    name, text = type(e).__name__, redact(str(e))
    url = redact(url)
    where = f"the endpoint {redact(endpoint())}" if endpoint() else "the store"
    if name in ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError"):
        return (f"cannot {doing} {url}: no credentials found; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for s3://, GOOGLE_APPLICATION_CREDENTIALS "
                "for gs://")
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError",
                "ConnectionError", "ServerDisconnectedError") or "connect" in text.lower():
        return (f"cannot {doing} {url}: {where} cannot be reached ({name}); check "
                "S3_ENDPOINT_URL / AWS_ENDPOINT_URL and the network")
    if _no_bucket(e):
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        return (f"cannot {doing} {url}: the bucket {bucket} does not exist at {where}; create "
                "it or correct the URL")
    if isinstance(e, PermissionError) or any(k in text for k in (
            "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden")):
        return (f"cannot {doing} {url}: access refused ({text.splitlines()[0] if text else name});"
                " check the credentials and the bucket's permissions")
    if isinstance(e, FileNotFoundError):
        return f"cannot {doing} {url}: not found"
    return f"cannot {doing} {url}: {name}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _no_bucket(e: Exception) -> bool:
    """The store's error says the bucket itself is missing (not an object under it)."""
    return "bucket does not exist" in str(e) or "NoSuchBucket" in str(e)


class Store:
    """A folder at a URL: paths relative to it, every call's failure one StorageError line."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(self.url)

    def __repr__(self) -> str:
        return f"Store({redact(self.url)!r})"

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def url_of(self, rel: str) -> str:
        return f"{self.url}/{rel}" if rel else self.url

    def listing(self, rel: str = "") -> dict[str, dict]:
        """Every object under `rel` (recursively): path relative to the store -> the store's
        details of it (size, ETag, ...); {} if none."""
        base = self._path(rel)
        self.fs.invalidate_cache(base)
        with storage_errors(self.url_of(rel), "list"):
            try:
                found = self.fs.find(base, detail=True)
            except FileNotFoundError as e:
                if _no_bucket(e):
                    raise
                return {}
        root = self.root + "/"
        return {path[len(root):] if path.startswith(root) else path: info
                for path, info in found.items() if info.get("type", "file") == "file"}

    def sizes(self, rel: str = "") -> dict[str, int]:
        """Every object under `rel` (recursively): relative path -> size; {} if none."""
        return {path: int(info.get("size") or 0) for path, info in self.listing(rel).items()}

    def info(self, rel: str) -> dict | None:
        """The object's details as the store gives them (size, ETag, ...), or None when there is
        no such object."""
        self.fs.invalidate_cache(self._path(rel))
        with storage_errors(self.url_of(rel), "look at"):
            try:
                info = self.fs.info(self._path(rel))
            except FileNotFoundError as e:
                if _no_bucket(e):
                    raise
                return None
        return info if info.get("type", "file") == "file" else None

    def size(self, rel: str) -> int | None:
        """The object's size, or None when there is none."""
        info = self.info(rel)
        return None if info is None else int(info.get("size") or 0)

    def read_bytes(self, rel: str) -> bytes:
        with storage_errors(self.url_of(rel), "read"):
            return self.fs.cat_file(self._path(rel))

    def write_bytes(self, rel: str, data: bytes) -> None:
        with storage_errors(self.url_of(rel), "write"):
            self.fs.pipe_file(self._path(rel), data)

    def put_file(self, local: Path, rel: str) -> None:
        with storage_errors(self.url_of(rel), "upload to"):
            self.fs.put_file(str(local), self._path(rel))

    def get_file(self, rel: str, local: Path) -> None:
        with storage_errors(self.url_of(rel), "download"):
            self.fs.get_file(self._path(rel), str(local))

    def open(self, rel: str, mode: str = "rb", **kwargs):
        """A file object (reads are ranged: nothing is downloaded whole)."""
        with storage_errors(self.url_of(rel), "open"):
            return self.fs.open(self._path(rel), mode, **kwargs)

    def remove(self, rels: list[str]) -> None:
        if rels:
            with storage_errors(self.url, "remove files from"):
                self.fs.rm([self._path(r) for r in rels])

    def check_writable(self) -> None:
        """Reach the store now (credentials, endpoint, bucket), before any work is done."""
        self.sizes()
