"""The parts of an exported folder every family shares, laid out as the Hugging Face hub takes it.

    with staged(out) as folder:                     # placed at `out` only once it is whole
        write_weights(state_dict, folder, "5GB")     # model.safetensors, or shards + index
        ids = write_tokenizer(tokenizer, folder, context)   # tokenizer.json + config + map
        write_generation_config(folder, ids)
    layout_problems(out)                             # [] for a folder upload_folder takes whole

Weights go through huggingface_hub's `save_torch_state_dict` (what transformers' save_pretrained
uses): one `model.safetensors` up to `max_shard_size` bytes, past it
`model-0000K-of-0000N.safetensors` and `model.safetensors.index.json` (its `weight_map` names
each tensor's shard), which `from_pretrained` reads.

The tokenizer is the build's, as a fast tokenizer (a tokenizer.json build: that file; a tiktoken
build: its ranks converted by transformers' own converter, offline, with tiktoken's special-token
ids kept). Its config names `model_input_names` ["input_ids", "attention_mask"] (so
`tok(text, return_tensors="pt")` has no token_type_ids and `model.generate(**tok(...))` works),
a pad token (the EOS: a padded place is masked, its id never read) and left padding, where a
decoder-only model's batch of prompts has to end (each row's last token is its own). The EOS
(and BOS, unknown) token is the build's own, by its text.

The folder is written under a hidden temporary name beside `out` and renamed to it last, after
its modes are set to what a hub upload keeps (files 0644, folders 0755): a failure leaves no
folder that looks complete. `layout_problems` checks what `huggingface_hub.upload_folder` would
take: plain files and folders only (no symlinks), no hidden or temporary names (upload_folder
skips .git and .cache/huggingface; anything else hidden would be uploaded), and every file the
others name present (the index's shards, config.json's auto_map modules, the shipped code's
relative imports, tokenizer.json).
"""

import ast
import base64
import json
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

from longpack.archs.hf.transformers_compat import import_transformers
from longpack.core import TrainingError

FILE_MODE, DIR_MODE = 0o644, 0o755


def refuse_taken(out: Path) -> None:
    """An export's --out must be a new or empty directory: it never writes over a user's file."""
    if out.exists() and not out.is_dir():
        raise TrainingError(f"--out {out} is not a directory: choose a new or empty directory")
    if out.is_dir() and any(out.iterdir()):
        raise TrainingError(f"--out {out} is not empty: choose a new or empty directory")


@contextmanager
def staged(out: Path):
    """A new folder to write the export into, placed at `out` when the block ends without an
    error (an empty `out` is replaced); removed, and `out` untouched, otherwise."""
    out = Path(out).absolute()  # `--out .`: beside the folder, not in it
    refuse_taken(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    except OSError as e:
        raise TrainingError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    try:
        yield tmp
        set_modes(tmp)
        if out.exists():
            out.rmdir()  # empty (checked above); a file put there since fails here
        tmp.rename(out)
    except OSError as e:  # a full disk, a file put at `out` meanwhile: one line, naming it
        shutil.rmtree(tmp, ignore_errors=True)
        raise TrainingError(f"--out {out}: the export could not be written ({e}); nothing "
                            "was left there") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def set_modes(folder: Path) -> None:
    """Files 0644, folders 0755, whatever the umask made them (mkdtemp: 0700)."""
    os.chmod(folder, DIR_MODE)
    for path in folder.rglob("*"):
        os.chmod(path, DIR_MODE if path.is_dir() else FILE_MODE)


def write_weights(weights: dict, folder: Path, max_shard_size: int | str = "5GB") -> None:
    """`weights` (name -> tensor, no two sharing memory) as safetensors: one file, or shards
    of at most `max_shard_size` bytes (a tensor larger than that alone in one) and their
    index."""
    from huggingface_hub import save_torch_state_dict

    weights = {k: v.detach().contiguous() for k, v in weights.items()}
    save_torch_state_dict(weights, folder, max_shard_size=max_shard_size,
                          metadata={"format": "pt"})


def special_tokens(tokenizer) -> dict[str, str]:
    """The build's special tokens by their text: eos, bos (the build's BOS, else its EOS, as
    GPT-2's), unk and pad (its EOS)."""
    if tokenizer.kind == "huggingface":
        text = tokenizer.reference.impl.id_to_token
    else:
        names = {i: t for t, i in tokenizer.reference.impl._special_tokens.items()}
        text = names.get
    eos = text(tokenizer.eos_id)
    bos = text(tokenizer.bos_id) if tokenizer.bos_id is not None else eos
    return {"bos_token": bos, "eos_token": eos, "unk_token": eos, "pad_token": eos}


def write_tokenizer(tokenizer, folder: Path, context: int) -> None:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json: the build's
    tokenizer as transformers' PreTrainedTokenizerFast loads it (`context`: its
    model_max_length)."""
    if tokenizer.kind == "huggingface":
        shutil.copyfile(tokenizer.source, folder / "tokenizer.json")
    else:
        (folder / "tokenizer.json").write_text(converted_tiktoken(tokenizer))
    specials = special_tokens(tokenizer)
    _write_json(folder / "special_tokens_map.json", specials)
    _write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", **specials,
        "model_input_names": ["input_ids", "attention_mask"], "padding_side": "left",
        "model_max_length": context, "clean_up_tokenization_spaces": False})


def converted_tiktoken(tokenizer) -> str:
    """transformers' converter of tiktoken's ranks, fed a ranks file written here."""
    import_transformers()
    from transformers.convert_slow_tokenizer import TikTokenConverter

    enc = tokenizer.reference.impl
    with tempfile.TemporaryDirectory() as tmp:
        ranks = Path(tmp) / "ranks.tiktoken"
        ranks.write_bytes(b"".join(base64.b64encode(token) + b" %d\n" % rank for token, rank
                                   in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1])))
        converted = TikTokenConverter(vocab_file=str(ranks), pattern=enc._pat_str,
                                      additional_special_tokens=enc._special_tokens).converted()
    # The converter numbers special tokens after the ranks; tiktoken's own ids may leave a gap
    # (cl100k_base: <|endoftext|> is 100257, its last rank 100255). tokenizers keeps an added
    # token's id only when the model's vocabulary holds it: put them there.
    data = json.loads(converted.to_str())
    for added in data["added_tokens"]:
        added["id"] = enc._special_tokens.get(added["content"], added["id"])
        data["model"]["vocab"][added["content"]] = added["id"]
    return json.dumps(data, ensure_ascii=False)


def special_token_ids(tokenizer, trained_on: dict | None) -> dict[str, int | None]:
    """bos/eos/pad ids for config.json and generation_config.json: the tokenizer's, else what
    the checkpoint recorded of the build's tokenizer (None when neither is known)."""
    eos = tokenizer.eos_id if tokenizer is not None else (trained_on or {}).get("eos_id")
    bos = tokenizer.bos_id if tokenizer is not None else (trained_on or {}).get("bos_id")
    return {"bos_token_id": eos if bos is None else bos, "eos_token_id": eos,
            "pad_token_id": eos}


def write_generation_config(folder: Path, ids: dict) -> None:
    transformers = import_transformers()
    _write_json(folder / "generation_config.json",
                {**ids, "transformers_version": transformers.__version__})


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def layout_problems(folder: Path) -> list[str]:
    """What keeps `folder` from being uploaded whole by huggingface_hub.upload_folder, and
    loaded from the hub as it loads here: one line each ([] when none)."""
    problems = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            problems.append(f"{rel}: a symlink (upload_folder would upload its target's bytes)")
        elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            problems.append(f"{rel}: neither a file nor a folder")
        elif any(part.startswith(".") or part == "__pycache__" or part.endswith(".tmp")
                 for part in rel.split("/")):
            problems.append(f"{rel}: a hidden or temporary name")
        elif stat.S_IMODE(mode) != (DIR_MODE if stat.S_ISDIR(mode) else FILE_MODE):
            problems.append(f"{rel}: mode {stat.S_IMODE(mode):o}")
    for name, needs in _references(folder).items():
        problems += [f"{name} names {n}, which is missing" for n in sorted(needs)
                     if not (folder / n).is_file()]
    return problems


def _references(folder: Path) -> dict[str, set[str]]:
    """file -> the files it makes transformers read."""
    refs = {}
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        refs[index.name] = set(json.loads(index.read_text())["weight_map"].values())
    else:
        refs["(the weights)"] = {"model.safetensors"}
    config = json.loads((folder / "config.json").read_text()) if (
        folder / "config.json").is_file() else {}
    refs["config.json"] = {ref.split(".")[0] + ".py" for ref in config.get("auto_map", {}).values()}
    if (folder / "tokenizer_config.json").is_file():
        refs["tokenizer_config.json"] = {"tokenizer.json"}
    for code in folder.glob("*.py"):
        refs[code.name] = {node.module + ".py" for node in ast.walk(ast.parse(code.read_text()))
                           if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}
    return refs
