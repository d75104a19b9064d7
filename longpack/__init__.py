"""longpack from Python: build, stats, merge, import_tokens, train, plan, export (api.py), with
the errors a caller can catch: `import longpack; longpack.build(out="./mds", ...)`.

longpack is one installed package, in layers that import only downward (the contract is
pyproject.toml's [tool.importlinter], checked by `lint-imports` in the test suite):

    longpack (api.py)          the Python API; the console scripts are each stage's cli.py
    longpack.zoo               what reads a run and its build: `zoo` export, generate, eval,
                               the model card
    longpack.training          the trainer and its dry-run planner (one setup for both)
    longpack.pipeline | longpack.archs
                               the data stage | the model definitions (each knows nothing
                               of the other)
    longpack.core              the kernel: errors, settings, atomic writes, the object store

Each part is entered through its package's names (`from longpack.pipeline import
read_manifest`), never its modules'. In the repository the stages keep their own top-level
folders (pipeline/, training/, archs/); longpack/pipeline, longpack/training and
longpack/archs are links to them, so the package is the same whether installed or edited.

The names load on first use, so that `import longpack` stays cheap and pulls in neither torch
nor fsspec.
"""

from longpack.core import lazy_names

_API = {  # name -> the module that defines it
    "build": "api", "stats": "api", "merge": "api", "import_tokens": "api",  # the commands
    "train": "api", "plan": "api", "export": "api",
    # the errors a caller can catch (the kernel's: longpack.core)
    "LongpackError": "core", "SettingsError": "core", "DataError": "core",
    "TrainingError": "core", "LoaderError": "core", "StorageError": "core",
}
__all__ = sorted(_API)
__getattr__ = lazy_names(__name__, _API)
