"""The families transformers has no class for, exported with their own modeling code:
MoE (and its hybrids, MoE with Mamba layers) and resonance.

    config = remote_config(model, context, ids)   # config.json: auto_map, family, its fields
    ship_code(folder)                             # the code config.json's auto_map names
    weights = remote_weights(model)               # "model." + archs' names, a tied head once

`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` reads config.json's
`auto_map`, imports configuration_longpack.py and modeling_longpack.py (archs/hf/, shipped as
they are) and, through their relative imports, archs' own model files, copied byte for byte:
the archs files import each other relatively (`from .layers import ...`), which works in the
archs package and in transformers' module cache alike, so nothing is rewritten and nothing of
longpack need be installed where the folder is loaded. Which archs files go is read from the
imports (the closure of modeling_longpack.py's relative imports), so a file archs adds ships
once a model file imports it.

Mamba does not come here: it ends in Mamba-2's RMSNorm, and every weight of it has its place
in transformers' own Mamba2ForCausalLM (longpack/zoo/hf_export.py). A hybrid's Mamba layers sit
among attention layers and experts, which Mamba2 has no place for: hybrids come here, and
mamba.py (their Mamba mixer) with them.
"""

import ast
import shutil
from dataclasses import asdict
from pathlib import Path

from longpack import archs
from longpack.archs.hf.transformers_compat import import_transformers

TEMPLATES = Path(__file__).parent  # configuration_longpack.py, modeling_longpack.py
ARCHS = Path(archs.__file__).parent
MODELING, CONFIGURATION = "modeling_longpack", "configuration_longpack"


def family_of(model) -> str:
    return next(f for f, (_, cls, _) in archs.FAMILIES.items() if isinstance(model, cls))


def shipped_files() -> dict[str, Path]:
    """name in the folder -> the file it is a copy of: the two files of archs/hf/ and the archs
    files they import, directly or through each other (relative imports). transformers copies
    a local folder's modules only as far as modeling_longpack.py imports them directly, so a
    file imported only through another is an error here (name it in modeling_longpack.py)."""
    files = {f"{name}.py": TEMPLATES / f"{name}.py" for name in (MODELING, CONFIGURATION)}
    direct = _relative_imports(files[f"{MODELING}.py"])
    todo = list(files.values())
    while todo:
        for name in _relative_imports(todo.pop()):
            if name not in files:
                files[name] = ARCHS / name
                todo.append(files[name])
    indirect = sorted(set(files) - direct - {f"{MODELING}.py"})
    if indirect:
        raise RuntimeError(f"{', '.join(indirect)}: imported by the shipped archs files but not "
                           f"by {MODELING}.py, so transformers would not copy them from a local "
                           f"folder: import them in archs/hf/{MODELING}.py")
    return files


def _relative_imports(path: Path) -> set[str]:
    """The files `from .name import ...` lines of `path` name (transformers' own rule)."""
    return {f"{node.module}.py" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}


def ship_code(folder: Path) -> None:
    for name, source in shipped_files().items():
        shutil.copyfile(source, folder / name)


def remote_config(model, context: int, ids: dict) -> dict:
    """config.json: what AutoConfig and AutoModelForCausalLM find the code by, the family and
    every field of its config dataclass, `max_position_embeddings` = `context`."""
    transformers = import_transformers()
    tied = model.head.weight is model.embed.weight
    return {"architectures": ["LongpackForCausalLM"], "model_type": "longpack",
            "auto_map": {"AutoConfig": f"{CONFIGURATION}.LongpackConfig",
                         "AutoModelForCausalLM": f"{MODELING}.LongpackForCausalLM"},
            "family": family_of(model), **stored_fields(model.cfg), "checkpointing": False,
            "max_position_embeddings": context, "tie_word_embeddings": tied,
            "use_cache": True, **ids, "torch_dtype": "float32",
            "transformers_version": transformers.__version__}


def stored_fields(cfg) -> dict:
    """The family config's fields as config.json holds them (configuration_longpack's names)."""
    from longpack.archs.hf.configuration_longpack import CONFIG_NAMES

    return {CONFIG_NAMES.get(k, k): v for k, v in asdict(cfg).items()}


def remote_weights(model) -> dict:
    """The wrapper's weights: archs' names after "model.", a head tied to the embedding left
    out (transformers ties it again from tie_word_embeddings)."""
    weights = {f"model.{k}": v for k, v in model.state_dict().items()}
    if model.head.weight is model.embed.weight:
        del weights["model.head.weight"]
    return weights
