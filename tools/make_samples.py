"""Regenerate pipeline/samples/ (the small real corpus shipped with the package) from ../shared.

    .venv/bin/python tools/make_samples.py [--shared ../shared] [--check]

What it writes, each a pure function of ../shared's files (same bytes on every run with the same
pyarrow and zlib; the sha256s go into pipeline/samples/README.md, which it writes too):

- fineweb-edu-sample/000_0000{0,1}.parquet: of each of ../shared's two FineWeb-Edu-schema files,
  the rows whose Debian package (the `file_path` column) has a permissive upstream licence
  (LICENCES below) and whose text is at most MAX_CHARS long, taken in the order of the sha256 of
  their `id` until PER_FILE are picked, then written in file order, with the same schema (and
  zstd, as the source files are), ROW_GROUP rows a row group.
- dolma-sample/: the three small `.json(l).gz` files copied byte for byte, and the first
  DOLMA_ZST_LINES lines of the `.jsonl.zst` file, byte for byte, as `.jsonl.gz` (gzip's mtime 0).
- gpt2.tiktoken: ../shared/tokenizers/gpt2.tiktoken, byte for byte (the default tokenizer's
  offline fallback looks for it at exactly this path).

`--check` writes nothing: it regenerates into a temporary folder and exits 1 when any file
differs from the shipped one.
"""

import argparse
import gzip
import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "pipeline" / "samples"
PER_FILE = 200  # documents taken from each FineWeb-Edu-schema file
MAX_CHARS = 40_000  # a few very long pages would otherwise be half the bytes
ROW_GROUP = 50
DOLMA_ZST = "CC-MAIN-20190717121559-20190717143559-00140.jsonl.zst"
DOLMA_ZST_LINES = 150
DOLMA_COPIED = ("000.json.gz", "cc_en_head-0091.jsonl.gz", "cc_en_head-0174.jsonl.gz")
GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"

# Debian 12 documentation packages whose upstream licence is permissive: each as the `Files: *`
# stanza of the package's /usr/share/doc/PACKAGE/copyright gives it (checked in the packages
# themselves, `apt-get download PACKAGE`); only rows of these are shipped.
LICENCES = {
    "cmake-doc": "BSD-3-Clause (CMake)",
    "libboost1.74-doc": "BSL-1.0 (Boost Software License)",
    "postgresql-doc-15": "PostgreSQL Licence",
    "python-pandas-doc": "BSD-3-Clause (pandas)",
    "python-scipy-doc": "BSD-3-Clause (SciPy)",
    "python-sklearn-doc": "BSD-3-Clause (scikit-learn)",
    "python-statsmodels-doc": "BSD-3-Clause (statsmodels)",
    "python3.11-doc": "PSF-2.0 (Python Software Foundation Licence)",
    "rust-doc": "MIT OR Apache-2.0 (Rust)",
    "sqlite3-doc": "public domain (SQLite)",
}


def package(file_path: str) -> str:
    """'debian/bookworm/cmake-doc_3.25.1-1_all.deb' -> 'cmake-doc'."""
    return file_path.rsplit("/", 1)[-1].split("_", 1)[0]


def fineweb_subset(src: Path, dst: Path) -> dict:
    table = pq.read_table(src)
    ids = table.column("id").to_pylist()
    texts = table.column("text").to_pylist()
    packages = [package(p) for p in table.column("file_path").to_pylist()]
    eligible = [i for i in range(len(ids))
                if packages[i] in LICENCES and len(texts[i]) <= MAX_CHARS]
    eligible.sort(key=lambda i: hashlib.sha256(ids[i].encode()).hexdigest())
    picked = sorted(eligible[:PER_FILE])
    subset = table.take(pa.array(picked, pa.int64()))
    assert subset.schema.equals(table.schema)
    pq.write_table(subset, dst, compression="zstd", row_group_size=ROW_GROUP)
    return {"docs": len(picked), "chars": sum(len(texts[i]) for i in picked),
            "packages": sorted({packages[i] for i in picked}),
            "texts": [texts[i] for i in picked]}


def dolma_subset(src: Path, dst: Path) -> None:
    with zstandard.ZstdDecompressor().stream_reader(src.open("rb")) as r:
        lines = r.read().split(b"\n")[:DOLMA_ZST_LINES]
    dst.write_bytes(gzip.compress(b"".join(line + b"\n" for line in lines), compresslevel=9,
                                  mtime=0))


def jsonl_texts(path: Path) -> list[str]:
    import json

    data = gzip.decompress(path.read_bytes()).decode()
    return [json.loads(line)["text"] for line in data.splitlines() if line.strip()]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make(shared: Path, out: Path) -> None:
    (out / "fineweb-edu-sample").mkdir(parents=True, exist_ok=True)
    (out / "dolma-sample").mkdir(parents=True, exist_ok=True)
    gpt2 = out / "gpt2.tiktoken"
    shutil.copyfile(shared / "tokenizers" / "gpt2.tiktoken", gpt2)
    if sha256(gpt2) != GPT2_SHA256:
        sys.exit(f"{shared}/tokenizers/gpt2.tiktoken is not GPT-2's ranks file (sha256 differs)")
    fw = {name: fineweb_subset(shared / "data/fineweb-edu-sample" / name,
                               out / "fineweb-edu-sample" / name)
          for name in ("000_00000.parquet", "000_00001.parquet")}
    for name in DOLMA_COPIED:
        shutil.copyfile(shared / "data/dolma-sample" / name, out / "dolma-sample" / name)
    dolma_gz = DOLMA_ZST.removesuffix(".zst") + ".gz"
    dolma_subset(shared / "data/dolma-sample" / DOLMA_ZST, out / "dolma-sample" / dolma_gz)
    dolma = {name: jsonl_texts(out / "dolma-sample" / name) for name in (*DOLMA_COPIED, dolma_gz)}
    (out / "README.md").write_text(readme(out, fw, dolma, gpt2))


def readme(out: Path, fw: dict, dolma: dict, gpt2: Path) -> str:
    import tiktoken

    from longpack.pipeline.tokenize.tokenizer import load_tokenizer

    enc = load_tokenizer(str(gpt2)).reference.impl
    assert isinstance(enc, tiktoken.Encoding)

    def tokens(texts):
        return sum(len(t) for t in enc.encode_ordinary_batch(texts, num_threads=1))

    def line(path: Path, docs: int, chars: int, toks: int) -> str:
        return (f"| `{path.relative_to(out)}` | {path.stat().st_size:,} | {docs:,} | {chars:,} | "
                f"{toks:,} | `{sha256(path)}` |")

    rows = [line(out / "fineweb-edu-sample" / n, f["docs"], f["chars"], tokens(f["texts"]))
            for n, f in fw.items()]
    rows += [line(out / "dolma-sample" / n, len(t), sum(map(len, t)), tokens(t))
             for n, t in dolma.items()]
    rows.append(f"| `gpt2.tiktoken` | {gpt2.stat().st_size:,} | - | - | - | `{sha256(gpt2)}` |")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.name != "README.md")
    packages = sorted({p for f in fw.values() for p in f["packages"]})
    licences = "\n".join(f"  - `{p}`: {LICENCES[p]}" for p in packages)
    return f"""# Samples shipped with longpack

A small real corpus and the GPT-2 vocabulary, installed with the package so that the README's
walk-through runs offline from a fresh clone: `pack build --dataset fineweb-edu-sample` and
`--dataset dolma-sample` read these folders when no `--input` is given
(pipeline/read/catalog.py), and `--tokenizer gpt2` falls back to `gpt2.tiktoken` here when
tiktoken cannot fetch its own file. `tools/make_samples.py` regenerates every file from the
shared corpus (`../shared`), byte for byte, and writes this README; `--check` compares.

| file | bytes | documents | characters | GPT-2 tokens | sha256 |
|---|---:|---:|---:|---:|---|
{chr(10).join(rows)}

{total:,} bytes in all. GPT-2 tokens: text only, without the EOS a build adds to each document.

## Origins and licences

- `fineweb-edu-sample/`: {sum(f["docs"] for f in fw.values())} rows of the two parquet files of
  `../shared/data/fineweb-edu-sample`, with the same schema (text, id, dump, url, file_path,
  language, language_score, token_count, score, int_score). Like those files, they are **not
  FineWeb-Edu text**: they are Debian 12 ("bookworm") documentation pages (HTML of
  documentation packages converted to text, one document per page) in FineWeb-Edu's schema;
  `language_score`, `score` and `int_score` come from heuristics, not from FineWeb-Edu's
  models. Each row's `file_path` names its Debian package, and only rows of packages whose
  upstream licence is permissive were taken, each as the `Files: *` stanza of the package's
  `/usr/share/doc/PACKAGE/copyright` in Debian 12 gives it (checked on 2026-11-27 in the packages
  themselves, `apt-get download PACKAGE`; cmake-doc's folder links to cmake-data's):
{licences}
- `dolma-sample/`: real Dolma-format documents (Common Crawl web text) from the test data of the
  public repository allenai/dolma, which is licensed Apache-2.0 (the Dolma corpus itself is
  released under ODC-By). `000.json.gz`, `cc_en_head-0091.jsonl.gz` and
  `cc_en_head-0174.jsonl.gz` are `../shared/data/dolma-sample`'s files unchanged (from the
  repository's `tests/data/provided/documents/` and `tests/data/multiple_files/`);
  `{DOLMA_ZST.removesuffix(".zst")}.gz` is the first {DOLMA_ZST_LINES} lines of
  `../shared`'s `{DOLMA_ZST}` (the repository's `tests/data/formats/zst/` file at commit
  937ccc06f6fa4cefba496b2f48cc77418b941345), byte for byte, gzipped.
- `gpt2.tiktoken`: the GPT-2 / r50k_base BPE ranks in tiktoken's format (50,256 ranks;
  `<|endoftext|>` = 50256 is added by the loader), a copy of
  `../shared/tokenizers/gpt2.tiktoken`, whose origin is the PyPI sdist `openai-whisper==20250625`
  (MIT), path `whisper/assets/gpt2.tiktoken`; OpenAI publishes the same vocabulary with tiktoken
  (MIT). Its sha256 is the one tiktoken expects for `r50k_base`.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    ap.add_argument("--check", action="store_true", help="compare, write nothing")
    args = ap.parse_args()
    if not (args.shared / "data").is_dir():
        sys.exit(f"the shared corpus is not at {args.shared}; pass --shared PATH")
    sys.path.insert(0, str(ROOT))
    if not args.check:
        make(args.shared, SAMPLES)
        print(f"wrote {SAMPLES}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        make(args.shared, Path(tmp))
        new = {str(p.relative_to(tmp)): p.read_bytes() for p in Path(tmp).rglob("*") if p.is_file()}
        old = {str(p.relative_to(SAMPLES)): p.read_bytes() for p in SAMPLES.rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
        differ = sorted(n for n in new.keys() | old.keys() if new.get(n) != old.get(n))
        if differ:
            sys.exit(f"pipeline/samples differs from a regeneration: {', '.join(differ)}")
        print("pipeline/samples is what tools/make_samples.py makes")


if __name__ == "__main__":
    main()
