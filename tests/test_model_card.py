"""longpack/zoo/model_card.py: an exported folder's README.md, read back with huggingface_hub's
ModelCard, for a run whose builds and files lived at paths of the machine that trained it."""

import json
import shutil
from pathlib import Path

from huggingface_hub import ModelCard

from conftest import vocab_of
from longpack import archs
from longpack.pipeline.builds.reader import dataset_fingerprint
from longpack.pipeline.read.catalog import DATASETS
from longpack.pipeline.read.hub import HubFiles
from longpack.zoo.model_card import model_card
from longpack.zoo.runs import TrainedRun


def trained(tmp_path: Path, builds: list[str], steps: int = 2) -> TrainedRun:
    """A run at tmp_path/home/me/runs/tiny that trained on `builds` (--shards values), its
    settings as a checkpoint holds them, every place one of the machine's."""
    run = tmp_path / "home" / "me" / "runs" / "tiny"
    run.mkdir(parents=True)
    records = [{"step": steps - 2, "tokens": 256, "loss": 6.5, "val_loss": 6.4},
               {"step": steps - 1, "tokens": 512, "loss": 6.25, "lm_loss": 6.25},
               {"step": steps, "tokens": 768, "loss": 6.0, "val_loss": 5.9}]  # after it
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    first = Path(builds[0].partition("=")[2] or builds[0])
    manifest = json.loads((first / "manifest.json").read_text())
    settings = {"shards": builds, "model": "neox-tiny", "max_steps": steps, "out": str(run),
                "cache": str(tmp_path / "home" / "me" / "cache"),
                "staging": str(tmp_path / "home" / "me" / "staging"),
                "upload": "s3://my-bucket/runs/tiny", "lr": 3e-4}
    model = archs.build("neox-tiny", vocab_size=vocab_of(first)).eval()
    return TrainedRun(model, None, manifest["tokenizer"], 65, run / f"step-{steps:08d}", steps,
                      settings, dataset_fingerprint(manifest))


def test_the_card_names_no_path_of_the_machine_that_trained_it(tmp_path, shards_once):
    """A run trained from .../home/me/data/mds (and from a build no longer there): the card
    names each build by its folder and manifest fingerprint, each input by its file name, the
    run by its folder, and leaves out where the run kept its files."""
    data = tmp_path / "home" / "me" / "data"
    build = Path(shutil.copytree(shards_once, data / "mds"))
    run = trained(tmp_path, [str(build), f"web={data / 'gone'}"])
    text = model_card(run, "tiny-hf", "apache-2.0", 1024, [])
    for place in (tmp_path, shards_once.parent, "/home/me", "my-bucket"):
        assert str(place) not in text, place
    manifest = json.loads((build / "manifest.json").read_text())
    (source,) = manifest["inputs"]  # the one input, at a path of the machine
    assert Path(source["path"]).is_absolute()
    card = ModelCard(text)
    assert card.data.license == "apache-2.0" and card.data.library_name == "transformers"
    assert card.data.pipeline_tag == "text-generation"
    assert card.data.tags == ["longpack", "gpt-neox"]
    assert card.data.datasets is None and card.data.base_model is None  # no fact to give
    # the checkpoint's last step's train loss, and the last val loss up to it, as metadata
    assert card.data.longpack == {"loss": 6.25, "lm_loss": 6.25, "val_loss": 6.4, "val_step": 0}
    counts = manifest["counts"]
    for fact in [f"`mds`, fingerprint `{dataset_fingerprint(manifest)}`",
                 f"- `{Path(source['path']).name}` ({source['size']:,} bytes)",
                 f"{counts['documents']:,} documents, {counts['tokens']:,} tokens",
                 "- `gone` (source web): its manifest is not here, so no counts",
                 "the checkpoint `step-00000002` of the run `tiny`", "512 (2 steps)",
                 f"| build fingerprint | `{run.fingerprint}` |",
                 "train \\\n  --shards mds \\\n  --shards web=gone \\\n  --model neox-tiny "
                 "\\\n  --max-steps 2\n"]:
        assert fact in card.text, fact
    command = card.text.split("```bash\n")[1].split("```")[0]
    for flag in ("--out", "--cache", "--staging", "--upload", "--lr"):  # --lr: the default
        assert flag not in command, flag


def test_a_build_of_hub_files_names_its_dataset(tmp_path, shards_once):
    """Inputs fetched from the hub (their URIs as pipeline/read/hub.py records them) are the
    card's `datasets`, and are listed as those URIs."""
    class Listing:
        def list_files(self, repo, revision):
            return "0123abcd", [("README.md", 10), ("sample/10BT/000_00000.parquet", 300)]

    hub = HubFiles(Listing(), DATASETS["fineweb-edu"], "sample-10BT")
    build = Path(shutil.copytree(shards_once, tmp_path / "fwe"))
    manifest = json.loads((build / "manifest.json").read_text())
    manifest["inputs"] = hub.describe()
    (build / "manifest.json").write_text(json.dumps(manifest))
    hub.close()
    card = ModelCard(model_card(trained(tmp_path, [str(build)]), "fwe-hf", "other", 1024,
                                ["gpt_neox.py"]))
    assert card.data.datasets == [DATASETS["fineweb-edu"].hub_repo]
    assert card.data.tags == ["longpack", "gpt-neox", "custom_code"]
    assert f"- `{hub.uri(0)}` (300 bytes)" in card.text
    assert "trust_remote_code=True" in card.text


def test_a_build_of_a_named_dataset_read_from_local_files_names_it(tmp_path, shards_once):
    """`pack build --dataset fineweb-edu --input ./local/*.parquet`: the card's datasets is the
    dataset's hub repository, though no input came from the hub."""
    build = Path(shutil.copytree(shards_once, tmp_path / "fwe"))
    manifest = json.loads((build / "manifest.json").read_text())
    manifest["settings"]["dataset"] = "fineweb-edu"
    (build / "manifest.json").write_text(json.dumps(manifest))
    card = ModelCard(model_card(trained(tmp_path, [str(build)]), "fwe-hf", "other", 1024, []))
    assert card.data.datasets == [DATASETS["fineweb-edu"].hub_repo]
