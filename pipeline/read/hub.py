"""Fetch a named dataset's files from the Hugging Face hub, lazily and in build order.

Only the files the build reaches are downloaded (a build stopped by --max-tokens never fetches
the rest); the next file is prefetched in the background while the current one is tokenized,
unless the token estimate says the build will stop within the current file. Downloads go to the
Hugging Face cache and resume after an interruption (huggingface_hub's own behaviour).
"""

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from longpack.core import HubError, SettingsError, install_hint
from longpack.pipeline.read.catalog import Dataset

NO_NETWORK_HINT = "pass --input with local files (directories and globs work)"


class HuggingFaceHub:
    """The real client. Tests use an object with the same two methods over local files."""

    def __init__(self):
        try:
            import huggingface_hub
        except ImportError:
            raise HubError("building without --input needs huggingface_hub: "
                           f"{install_hint('hub')}, or {NO_NETWORK_HINT}") from None
        self._hub = huggingface_hub

    def list_files(self, repo: str, revision: str | None) -> tuple[str, list[tuple[str, int]]]:
        try:
            info = self._hub.HfApi().dataset_info(repo, revision=revision, files_metadata=True)
        except Exception as e:
            raise HubError(f"cannot reach the Hugging Face hub for {repo} "
                           f"({type(e).__name__}); {NO_NETWORK_HINT}") from None
        return info.sha, [(s.rfilename, s.size or 0) for s in info.siblings]

    def download(self, repo: str, revision: str, path: str) -> Path:
        try:
            return Path(self._hub.hf_hub_download(repo, path, repo_type="dataset",
                                                  revision=revision))
        except Exception as e:
            raise HubError(f"download of {path} from {repo} failed ({type(e).__name__}: {e}); "
                           f"re-run to resume it, or {NO_NETWORK_HINT}") from None


class HubFiles:
    """The build's input files on the hub: `path(i)` blocks until file i is local."""

    def __init__(self, client, dataset: Dataset, subset: str, revision: str | None = None):
        self.client, self.repo = client, dataset.hub_repo
        self.revision, listing = client.list_files(self.repo, revision)
        self.files = select_hub_files(dataset, subset, listing)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hub-download")
        self._futures: dict[int, Future] = {}
        self._lock = threading.Lock()

    def describe(self) -> list[dict]:
        """Each file's URI and size, for the build's fingerprint."""
        return [{"path": self.uri(i), "size": size} for i, (_, size) in enumerate(self.files)]

    def uri(self, i: int) -> str:
        return f"hf://datasets/{self.repo}@{self.revision}/{self.files[i][0]}"

    def _fetch(self, i: int) -> Future:
        with self._lock:
            if i not in self._futures:
                self._futures[i] = self._pool.submit(self.client.download, self.repo,
                                                     self.revision, self.files[i][0])
            return self._futures[i]

    def path(self, i: int, prefetch_next: bool = True) -> Path:
        local = self._fetch(i).result()
        if prefetch_next and i + 1 < len(self.files):
            self._fetch(i + 1)
        return local

    def close(self):
        self._pool.shutdown(wait=True, cancel_futures=True)


def hub_prefix(subset: str) -> str:
    """Folder of a FineWeb(-Edu) subset in its repository: 'sample-10BT' -> 'sample/10BT/',
    'CC-MAIN-2024-10' -> 'data/CC-MAIN-2024-10/', 'default' -> 'data/'."""
    if subset == "default":
        return "data/"
    if subset.startswith("sample-"):
        return f"sample/{subset.removeprefix('sample-')}/"
    return f"data/{subset}/"


def select_hub_files(dataset: Dataset, subset: str, listing: list[tuple[str, int]]
                     ) -> list[tuple[str, int]]:
    """The (path, size) entries of a repository listing that make up `subset`, in build order."""
    prefix = hub_prefix(subset)
    picked = sorted((p, s) for p, s in listing
                    if p.startswith(prefix) and dataset.names.match(p.rsplit("/", 1)[-1]))
    if not picked:
        raise SettingsError(
            f"the hub repository {dataset.hub_repo} has no {', '.join(dataset.patterns)} files "
            f"under {prefix} (subset {subset!r}); check --subset")
    return picked
