"""Where a build's files are written and where they go, resolved once at the command line
(pipeline/cli.py, longpack/api.py) and passed down to the engines, the tasks and the uploads:

    Destination(local=Path("OUT"), url=None)                       --out OUT
    Destination(local=STAGING/<16 hex>/out, url="s3://b/prefix")   --out s3://b/prefix

A build at a URL runs in `local` exactly as a local build in OUT and its files go up as they
finish (`output`: remote_build.py's UploadOutput); nothing below the command line asks again
which one it is."""

import dataclasses
from pathlib import Path

from longpack.core import is_url, staging_folder
from longpack.pipeline.config import BuildConfig


@dataclasses.dataclass(frozen=True)
class Destination:
    local: Path  # --out, or the staging folder of an --out URL
    url: str | None  # the --out URL (no trailing /), or None for a local --out

    @classmethod
    def of(cls, cfg: BuildConfig) -> "Destination":
        if not is_url(cfg.out):
            return cls(Path(cfg.out), None)
        return cls(staging_folder(cfg.out, cfg.staging) / "out", cfg.out.rstrip("/"))

    def local_config(self, cfg: BuildConfig) -> BuildConfig:
        """The settings the build runs with: --out its local folder."""
        if self.url is None:
            return cfg
        return dataclasses.replace(cfg, out=str(self.local), staging=None)

    def output(self, local_cfg: BuildConfig):
        """The Output of a single-machine build (build.py) of `local_cfg` (local_config's):
        OUT's shards, or their staged copy going up to the URL."""
        if self.url is not None:
            from longpack.pipeline.store.remote_build import UploadOutput

            return UploadOutput(local_cfg, self.url)
        from longpack.pipeline.pack.output import ShardOutput

        return ShardOutput(local_cfg)
