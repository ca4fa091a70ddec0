"""PAC-S++ Table 8's path on tiny models: `pacs correlate` with a checkpoint folder of every backbone family.

`pacs correlate flickr8k-expert` and `flickr8k-cf` run in-process (`pacs.cli.main`) on a small subset of the real
Flickr8k judgments and images, with `--checkpoint FOLDER` of each tiny family of `tests/backbone_fixtures.py`
(open_clip SigLIP, open_clip SigLIP2-style, transformers CLIP / SigLIP / Siglip2), `--metrics clip-s,ref-clip-s`
and `--score cosine` (and `--score sigmoid` where the model has a logit bias). The expected Kendall τ is computed
here from the libraries' own forward (open_clip's tokenizer, transform and `encode_*`; transformers' processor
and `get_*_features`) and `scipy.stats.kendalltau`, never from pacs.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.stats import kendalltau

from pacs import cli as pacs_cli

OPEN_CLIP = ("open_clip-siglip", "open_clip-siglip2")
TRANSFORMERS = ("transformers-clip", "transformers-siglip", "transformers-siglip2")
FAMILIES = OPEN_CLIP + TRANSFORMERS
WITH_BIAS = ("open_clip-siglip", "open_clip-siglip2", "transformers-siglip", "transformers-siglip2")
RUNS = [(name, "cosine") for name in FAMILIES] + [(name, "sigmoid") for name in WITH_BIAS]
PROMPT = "A photo depicts "  # the CLIP-S prompt every candidate is scored with
N_IMAGES, PER_IMAGE = 6, 2  # judged pairs: two candidates for each of six images
# a seed whose random towers give positive cosines on these photos (seed 0's Siglip2 gives none: w·max(cos, 0)
# would be 0 everywhere and τ undefined)
SEEDS = {"transformers-siglip2": 4}


@pytest.fixture(scope="module")
def family_folder(tmp_path_factory):
    """`get(name) -> folder` of the tiny backbone `name` (a key of `backbone_fixtures.BUILDERS`), built once."""
    from backbone_fixtures import BUILDERS

    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = BUILDERS[name](tmp_path_factory.mktemp(name.replace("-", "_")), seed=SEEDS.get(name, 0))
        return built[name]

    return get


def _pick(lines: list[str], captions: dict[str, str], refs: dict[str, list[str]], on_disk: set[str]) -> list[str]:
    """PER_IMAGE judged lines for each of the first N_IMAGES images on disk, candidates not among the image's captions."""
    chosen: dict[str, list[str]] = {}
    for line in lines:
        image, caption_id = line.split("\t")[:2]
        if image not in on_disk or captions[caption_id] in refs[image]:
            continue
        if image in chosen or len(chosen) < N_IMAGES:
            rows = chosen.setdefault(image, [])
            if len(rows) < PER_IMAGE:
                rows.append(line)
    return [line for rows in chosen.values() for line in rows]


@pytest.fixture(scope="module")
def subset(shared_data, tmp_path_factory) -> dict:
    """A Flickr8k data folder holding a few rows of each annotation file and the token lines they need."""
    source = shared_data / "flickr8k"
    token_lines = (source / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines()
    captions = dict(line.split("\t", 1) for line in token_lines if "\t" in line)
    refs: dict[str, list[str]] = {}
    for key, caption in captions.items():
        refs.setdefault(key.split("#")[0], []).append(caption)
    on_disk = {path.name for path in (source / "images").iterdir()}
    folder = tmp_path_factory.mktemp("flickr8k_subset")
    picked = {}
    for name in ("ExpertAnnotations.txt", "CrowdFlowerAnnotations.txt"):
        lines = _pick((source / name).read_text(encoding="utf-8").splitlines(), captions, refs, on_disk)
        assert len(lines) == N_IMAGES * PER_IMAGE
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        picked[name] = [line.split("\t") for line in lines]
    needed = {fields[1] for rows in picked.values() for fields in rows}
    needed |= {key for key in captions if key.split("#")[0] in {f[0] for rows in picked.values() for f in rows}}
    (folder / "Flickr8k.token.txt").write_text(
        "\n".join(line for line in token_lines if line.split("\t")[0] in needed) + "\n", encoding="utf-8")

    def judged(name: str, expert: bool) -> tuple[list[str], list[str], list[float]]:
        """(image, candidate, rating) per row: three rows (the experts) per pair, or one (the share of yes)."""
        rows = [(f[0], " ".join(captions[f[1]].split()), float(r)) for f in picked[name]
                for r in (f[2:5] if expert else f[2:3])]
        return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]

    return {"dir": folder, "images": source / "images", "flickr8k-expert": judged("ExpertAnnotations.txt", True),
            "flickr8k-cf": judged("CrowdFlowerAnnotations.txt", False)}


class Reference:
    """Cosines of (image, prompted caption) through the library's own forward, and the tokens each caption needs."""

    def __init__(self, name: str, folder: str) -> None:
        self.name = name
        if name in OPEN_CLIP:
            import open_clip

            self.model, _, self.transform = open_clip.create_model_and_transforms(f"local-dir:{folder}")
            self.tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")
            self.context = self.tokenizer.context_length
            self.scale = math.exp(self.model.logit_scale.item())
            self.bias = self.model.logit_bias.item()
        else:
            from transformers import AutoModel, AutoProcessor

            self.model = AutoModel.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
            self.processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
            self.context = self.model.config.text_config.max_position_embeddings
            bias = getattr(self.model, "logit_bias", None)
            self.scale = math.exp(self.model.logit_scale.item())
            self.bias = None if bias is None else bias.item()
        self.model.eval()

    def _text(self, texts: list[str]) -> torch.Tensor:
        if self.name in OPEN_CLIP:
            return self.model.encode_text(self.tokenizer(texts))
        tokens = self.processor.tokenizer(texts, padding="max_length", max_length=self.context, truncation=True,
                                          return_tensors="pt")
        return self.model.get_text_features(input_ids=tokens.input_ids).pooler_output

    def _image(self, image: Image.Image) -> torch.Tensor:
        if self.name in OPEN_CLIP:
            return self.model.encode_image(self.transform(image)[None])
        pixels = self.processor.image_processor(images=[image], return_tensors="pt")
        return self.model.get_image_features(**pixels).pooler_output

    def cosines(self, image_dir: Path, images: list[str], candidates: list[str]) -> np.ndarray:
        """cos(image_i, PROMPT + candidate_i), one forward per distinct image and caption."""
        texts = sorted(set(candidates))
        photos = sorted(set(images))
        with torch.no_grad():
            text = torch.nn.functional.normalize(self._text([PROMPT + t for t in texts]), dim=-1)
            pictures = []
            for photo in photos:
                with Image.open(image_dir / photo) as handle:
                    pictures.append(self._image(handle.convert("RGB"))[0])
            image = torch.nn.functional.normalize(torch.stack(pictures), dim=-1)
        return np.array([float(image[photos.index(i)] @ text[texts.index(c)]) for i, c in zip(images, candidates)])

    def n_too_long(self, candidates: list[str]) -> int:
        """Distinct candidates whose prompted tokens (special tokens included, nothing cut) exceed the context."""
        tokenizer = self.tokenizer.tokenizer if self.name in OPEN_CLIP else self.processor.tokenizer
        return sum(len(tokenizer(PROMPT + text)["input_ids"]) > self.context for text in set(candidates))


def _correlate(subset: dict, benchmark: str, folder: str, score: str, out: Path) -> dict:
    code = pacs_cli.main(["correlate", benchmark, "--data", str(subset["dir"]), "--images", str(subset["images"]),
                          "--checkpoint", folder, "--metrics", "clip-s,ref-clip-s", "--score", score,
                          "--out", str(out)])
    assert code == 0
    return json.loads(out.read_text())


def _tau(values: np.ndarray, ratings: list[float], variant: str) -> float:
    return 100.0 * float(kendalltau(values, ratings, variant=variant).statistic)


@pytest.mark.parametrize("name, score", RUNS, ids=[f"{n}-{s}" for n, s in RUNS])
@pytest.mark.parametrize("benchmark", ["flickr8k-expert", "flickr8k-cf"])
def test_correlate_with_each_family_equals_kendall_of_the_models_own_scores(name, score, benchmark, subset,
                                                                            family_folder, tmp_path):
    folder = family_folder(name)
    table = _correlate(subset, benchmark, folder, score, tmp_path / "table.json")
    images, candidates, ratings = subset[benchmark]
    rows = len(ratings)
    assert table["benchmark"] == benchmark
    for metric in ("clip-s", "ref-clip-s"):
        assert table[metric]["n"] == rows
        assert isinstance(table[metric]["tau_b"], float) and isinstance(table[metric]["tau_c"], float)
    config = table["provenance"]["config"]
    assert (config["score"], config["long_captions"], config["checkpoint"]) == (score, "truncate", folder)
    assert set(table["provenance"]["models"]) == {"clip-s", "ref-clip-s"}
    assert table["provenance"]["models"]["clip-s"]["backbone"]

    reference = Reference(name, folder)
    cosines = reference.cosines(subset["images"], images, candidates)
    # cosine: w·max(cos, 0) (w > 0 leaves τ unchanged); sigmoid: sigmoid(scale·cos + bias), increasing in cos
    expected = np.maximum(cosines, 0.0) if score == "cosine" else 1.0 / (1.0 + np.exp(-(reference.scale * cosines
                                                                                          + reference.bias)))
    assert len(set(np.round(expected, 6))) > 2, "the tiny model's scores do not vary: the check would be void"
    assert table["clip-s"]["tau_b"] == pytest.approx(_tau(expected, ratings, "b"), abs=1e-6)
    assert table["clip-s"]["tau_c"] == pytest.approx(_tau(expected, ratings, "c"), abs=1e-6)
    truncated = reference.n_too_long(candidates)
    assert truncated > 0 or name == "transformers-clip"  # contexts of 16 tokens cut most Flickr8k captions
    assert table["counts"].get("truncated_captions[clip-s]", 0) == truncated


def test_sigmoid_on_a_model_without_a_logit_bias_is_one_clear_error(subset, family_folder, tmp_path, capsys):
    out = tmp_path / "table.json"
    folder = family_folder("transformers-clip")  # built (and saved, with its progress bar) on first use
    capsys.readouterr()
    code = pacs_cli.main(["correlate", "flickr8k-expert", "--data", str(subset["dir"]), "--images",
                          str(subset["images"]), "--checkpoint", folder,
                          "--metrics", "clip-s", "--score", "sigmoid", "--out", str(out)])
    assert code == 2 and not out.exists()
    error = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "Loading weights" not in line]
    assert len(error) == 1 and "sigmoid" in error[0] and "logit bias" in error[0], error


def test_chunk_mode_is_recorded_in_the_provenance(subset, family_folder, tmp_path):
    out = tmp_path / "table.json"
    assert pacs_cli.main(["correlate", "flickr8k-expert", "--data", str(subset["dir"]), "--images",
                          str(subset["images"]), "--checkpoint", family_folder("open_clip-siglip"),
                          "--metrics", "clip-s,length", "--long-captions", "chunk", "--out", str(out)]) == 0
    config = json.loads(out.read_text())["provenance"]["config"]
    assert (config["score"], config["long_captions"]) == ("cosine", "chunk")
