"""The one place that imports mosaicml-streaming.

`import streaming` imports `streaming.vision`, which imports torchvision. The torchvision wheel
on PyPI is built for CUDA and fails to load next to a CPU-only torch ("operator torchvision::nms
does not exist"), and data preparation runs on CPU-only nodes. Nothing longpack uses needs
`streaming.vision`, so when torchvision cannot load we register an empty module under that name
before importing streaming.
"""

import sys
import types


def import_streaming():
    if "streaming" not in sys.modules and "streaming.vision" not in sys.modules:
        try:
            import torchvision  # noqa: F401
        except Exception:  # RuntimeError on CPU torch, ImportError when absent
            sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
    import streaming

    return streaming
