"""A package's names, each loaded on first use (PEP 562's module __getattr__), so that importing
a package stays cheap: `import longpack` pulls in neither torch nor fsspec until a name that
needs them is used. Every package of longpack gives its public names this way."""

import importlib


def lazy_names(package: str, table: dict[str, str]):
    """The __getattr__ of `package` giving each name of `table`: name -> the module (relative to
    the package) that defines it, or "module:attr" where the names differ."""

    def __getattr__(name: str):
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = table[name].partition(":")
        return getattr(importlib.import_module(f"{package}.{module}"), attr or name)

    return __getattr__
