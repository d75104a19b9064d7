"""The one place that imports Hugging Face transformers (zoo export and its tests).

transformers imports torchvision wherever the package is installed, and the torchvision wheel
on PyPI is built for CUDA: next to a CPU-only torch it fails to load ("operator torchvision::nms
does not exist"; pipeline/formats/streaming_compat.py meets the same wheel), and a second import after
a failed one may even half-succeed. Nothing longpack uses of transformers needs torchvision, so
transformers is always told it is absent, before any of its models is imported. (The README's
install pins a pair that loads, and tests/test_user_environment.py checks that plain transformers
works there; this keeps longpack working beside a mismatched pair.)
"""


def import_transformers():
    import transformers.utils.import_utils as available

    available._torchvision_available = False
    import transformers

    return transformers
