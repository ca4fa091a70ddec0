"""The generator of synthetic positives: a caption t' per real image (BLIP) and an image v' per real caption (SD).

Input: a Karpathy-split JSON (``dataset_coco.json``: ``images[].filepath/filename/split/sentences[].raw``) or a
COCO captions JSON (``images[]`` + ``annotations[]``) plus an image root. Output, in ``output_dir``:
``gen_images/<caption_id>.png``, ``manifest.jsonl`` (one line per real pair: ``{image_id, caption_id,
real_image, caption, gen_caption, gen_image, split, seed}``) and ``positives_meta.json`` (models, seeds,
settings, provenance). Work is sharded over accelerate processes by image; each process appends to its own
``manifest.partNNN.jsonl`` as it goes, so a restarted run (with any number of processes) skips what exists. Karpathy ``restval`` is ``train``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from annotated_types import Le
from PIL import Image
from tqdm.auto import tqdm

from pacs.metric.common.config import (
    MAX_BEAM,
    MAX_IMAGES,
    MAX_LENGTH,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    Seed,
)
from pacs.metric.common.contained_paths import user_path
from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.common.io import atomic_path, write_json_atomic
from pacs.metric.common.json_input import DuplicateKeyError, read_json_file, unique_keys
from pacs.metric.common.link_safety import open_no_follow
from pacs.metric.common.provenance import provenance
from pacs.metric.training.data import load_rgb

logger = logging.getLogger(__name__)

DEFAULT_CAPTIONER = "Salesforce/blip-image-captioning-large"
DEFAULT_TEXT_TO_IMAGE = "stable-diffusion-v1-5/stable-diffusion-v1-5"
ImageCaptioner = Callable[[Sequence[Image.Image]], list[str]]
ImageGenerator = Callable[[Sequence[str], Sequence[int]], list[Image.Image]]


@dataclass
class PositivesConfig:
    """What to generate, with which models, where to write it."""

    dataset: str | None = None
    image_root: str | None = None
    output_dir: str = "runs/positives"
    splits: list[str] = field(default_factory=lambda: ["train", "restval", "val"])
    captioner: str = DEFAULT_CAPTIONER
    text_to_image: str = DEFAULT_TEXT_TO_IMAGE
    seed: Seed = 0
    caption_max_length: Annotated[PositiveInt, Le(MAX_LENGTH)] = 30
    caption_num_beams: Annotated[PositiveInt, Le(MAX_BEAM)] = 3
    num_inference_steps: Annotated[PositiveInt, Le(1000)] = 50
    guidance_scale: NonNegativeFloat = 7.5
    image_size: Annotated[PositiveInt, Le(1024)] = 512  # Stable Diffusion at 1024² is ~20 GB
    safety_checker: bool = True
    batch_size: Annotated[PositiveInt, Le(256)] = 8
    limit: Annotated[NonNegativeInt, Le(MAX_IMAGES)] = 0
    device: str | None = None
    dtype: str = "float32"
    skip_missing: bool = False

    def validate(self) -> None:
        """Cross-field checks run when the config is loaded (pacs.metric.common.config.from_dict)."""
        if self.dtype not in DTYPES:
            raise InputError(f"dtype={self.dtype!r}: expected one of {', '.join(DTYPES)}")


@dataclass
class SourceImage:
    """A real image and its human captions (caption ids aligned with captions)."""

    image_id: str
    path: Path
    relpath: str
    split: str
    captions: list[str]
    caption_ids: list[str]


def read_caption_dataset(path: str | os.PathLike, image_root: str | os.PathLike | None,
                         splits: Sequence[str] | None = None) -> list[SourceImage]:
    """Read a Karpathy-split or COCO captions JSON into images with captions (in file order)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"dataset file not found: {path}")
    data = read_json_file(path, "dataset")  # one line for malformed JSON or a repeated key
    root = (Path(image_root) if image_root else path.parent).resolve()
    if isinstance(data, dict) and "annotations" in data:
        images = _read_coco(data, path, root)
    elif isinstance(data, dict) and isinstance(data.get("images"), list):
        images = _read_karpathy(data, path, root)
    else:
        raise InputError(f"{path}: neither a Karpathy split file (images[].sentences) nor COCO captions "
                         "(images[] + annotations[])")
    if splits is not None:
        images = [image for image in images if image.split in splits]
    return images


def _read_karpathy(data: dict, path: Path, root: Path) -> list[SourceImage]:
    images = []
    for index, entry in enumerate(data["images"]):
        try:
            image_id = str(entry.get("cocoid", entry.get("imgid", index)))
            relpath = str(Path(entry.get("filepath", "")) / entry["filename"])
            sentences = entry["sentences"]
        except (KeyError, TypeError, AttributeError) as error:
            raise InputError(f"{path}: images[{index}] lacks {error}") from None
        captions = [str(s.get("raw", " ".join(s.get("tokens", [])))) for s in sentences]
        ids = [str(s.get("sentid", f"{image_id}_{k}")) for k, s in enumerate(sentences)]
        file = user_path(root, relpath, f"{path}: images[{index}] (image {image_id!r}) file", f"the image root {root}")
        images.append(SourceImage(image_id, file, relpath, str(entry.get("split", "train")), captions, ids))
    return images


def _read_coco(data: dict, path: Path, root: Path) -> list[SourceImage]:
    by_id: dict[str, SourceImage] = {}
    for index, entry in enumerate(data.get("images", [])):
        try:
            image_id, filename = str(entry["id"]), str(entry["file_name"])
        except (KeyError, TypeError) as error:
            raise InputError(f"{path}: images[{index}] lacks {error}") from None
        file = user_path(root, filename, f"{path}: images[{index}] (image {image_id!r}) file_name", f"the image root {root}")
        by_id[image_id] = SourceImage(image_id, file, filename, str(entry.get("split", "train")), [], [])
    for index, annotation in enumerate(data["annotations"]):
        try:
            image_id, caption = str(annotation["image_id"]), str(annotation["caption"])
        except (KeyError, TypeError) as error:
            raise InputError(f"{path}: annotations[{index}] lacks {error}") from None
        if image_id not in by_id:
            raise InputError(f"{path}: annotations[{index}] names image_id {image_id} absent from images[]")
        by_id[image_id].captions.append(caption)
        by_id[image_id].caption_ids.append(str(annotation.get("id", f"{image_id}_{len(by_id[image_id].captions)}")))
    return [image for image in by_id.values() if image.captions]


def caption_seed(base_seed: int, caption_id: str) -> int:
    """The generation seed of one caption: stable across runs, shards and resumes."""
    return int.from_bytes(hashlib.sha256(f"{base_seed}:{caption_id}".encode()).digest()[:4], "big")


DTYPES = ("float32", "float16", "bfloat16")


def torch_dtype(name: str) -> Any:
    """The torch dtype named by the config (float16 / bfloat16 for generation on GPUs)."""
    import torch

    if name not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return getattr(torch, name)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def _missing_model(kind: str, name: str, option: str, error: Exception) -> MissingResourceError:
    return MissingResourceError(
        f"{kind} model {name!r} is not available (HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '0')}): "
        f"download it once (e.g. `huggingface-cli download {name}`) or pass a local copy saved with "
        f"save_pretrained as {option}=PATH. Cause: {str(error).splitlines()[0][:200]}")


class BlipCaptioner:
    """Image → caption with a transformers BLIP captioning model (beam search)."""

    def __init__(self, processor: Any, model: Any, max_length: int = 30, num_beams: int = 3, device: str = "cpu"):
        self.processor, self.model = processor, model.to(device).eval()
        self.max_length, self.num_beams, self.device = max_length, num_beams, device

    @classmethod
    def load(cls, name: str, max_length: int = 30, num_beams: int = 3, device: str = "cpu",
             dtype: str = "float32") -> BlipCaptioner:
        """Load BLIP from a hub id or a local folder; a missing model is one clear MissingResourceError."""
        from transformers import BlipForConditionalGeneration, BlipProcessor

        try:
            processor = BlipProcessor.from_pretrained(name, local_files_only=_offline())
            model = BlipForConditionalGeneration.from_pretrained(name, local_files_only=_offline(),
                                                                 dtype=torch_dtype(dtype))
        except (OSError, ValueError) as error:
            raise _missing_model("image-captioning (BLIP)", name, "captioner", error) from None
        return cls(processor, model, max_length, num_beams, device)

    def __call__(self, images: Sequence[Image.Image]) -> list[str]:
        """One caption per image."""
        import torch

        inputs = self.processor(images=[image.convert("RGB") for image in images], return_tensors="pt")
        inputs = inputs.to(self.device)
        inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
        with torch.no_grad():
            ids = self.model.generate(**inputs, max_length=self.max_length, num_beams=self.num_beams)
        return [text.strip() for text in self.processor.batch_decode(ids, skip_special_tokens=True)]


class DiffusionImages:
    """Caption → image with a diffusers text-to-image pipeline (one seeded generator per prompt)."""

    def __init__(self, pipeline: Any, num_inference_steps: int = 50, guidance_scale: float = 7.5, size: int = 512,
                 device: str = "cpu"):
        self.pipeline = pipeline.to(device)
        self.pipeline.set_progress_bar_config(disable=True)
        self.steps, self.guidance, self.size, self.device = num_inference_steps, guidance_scale, size, device

    @classmethod
    def load(cls, name: str, safety_checker: bool = True, num_inference_steps: int = 50, guidance_scale: float = 7.5,
             size: int = 512, device: str = "cpu", dtype: str = "float32") -> DiffusionImages:
        """Load a Stable Diffusion pipeline from a hub id or a local folder (needs the `generate` extra)."""
        try:
            from diffusers import AutoPipelineForText2Image
        except ImportError:
            raise MissingResourceError("text-to-image generation needs diffusers: "
                                       "pip install 'pacs-captioning[generate]'") from None
        kwargs: dict[str, Any] = {"local_files_only": _offline(), "torch_dtype": torch_dtype(dtype)}
        if not safety_checker:
            kwargs.update(safety_checker=None, requires_safety_checker=False)
        try:
            pipeline = AutoPipelineForText2Image.from_pretrained(name, **kwargs)
        except (OSError, ValueError) as error:
            raise _missing_model("text-to-image (Stable Diffusion)", name, "text_to_image", error) from None
        return cls(pipeline, num_inference_steps, guidance_scale, size, device)

    def __call__(self, prompts: Sequence[str], seeds: Sequence[int]) -> list[Image.Image]:
        """One image per prompt, each from its own seed."""
        import torch

        generators = [torch.Generator(device="cpu").manual_seed(int(seed)) for seed in seeds]
        result = self.pipeline(list(prompts), num_inference_steps=self.steps, guidance_scale=self.guidance,
                               height=self.size, width=self.size, generator=generators)
        return list(result.images)


def _read_done(part: Path) -> dict[str, list[dict[str, Any]]]:
    """Rows already written to a shard file, by image id (a torn last line is ignored)."""
    done: dict[str, list[dict[str, Any]]] = {}
    if not part.is_file():
        return done
    for line in part.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line, object_pairs_hook=unique_keys)
        except (json.JSONDecodeError, DuplicateKeyError):  # a part line cut by a kill (or tampered): redone
            continue
        done.setdefault(str(row["image_id"]), []).append(row)
    return done


def _read_all_done(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Rows of every shard file of `out` by image id, one per caption id (a resume may use another process count)."""
    by_image: dict[str, dict[str, dict[str, Any]]] = {}
    for part in sorted(out.glob("manifest.part*.jsonl")):
        for image_id, rows in _read_done(part).items():
            for row in rows:
                by_image.setdefault(image_id, {}).setdefault(str(row["caption_id"]), row)
    return {image_id: list(rows.values()) for image_id, rows in by_image.items()}


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def generate_positives(config: PositivesConfig, captioner: ImageCaptioner | None = None,
                       image_generator: ImageGenerator | None = None) -> Path:
    """Generate t' for every image and v' for every caption; return the merged manifest's path.

    `captioner` / `image_generator` replace the models named in the config (e.g. models built in code).
    """
    if not config.dataset:
        raise InputError("dataset is required (a Karpathy split JSON or COCO captions JSON)")
    splits = list(config.splits) if config.splits else None
    images = read_caption_dataset(config.dataset, config.image_root, splits)
    if config.limit:
        images = images[: config.limit]
    missing = [image for image in images if not image.path.is_file()]
    if missing and not config.skip_missing:
        raise InputError(f"{config.dataset}: image {missing[0].image_id} not found at {missing[0].path} "
                         f"({len(missing)} missing; skip_missing=true skips them)")
    if missing:
        logger.warning("skipping %d image(s) whose files are missing (first: %s)", len(missing), missing[0].path)
        images = [image for image in images if image.path.is_file()]
    if not images:
        raise InputError(f"{config.dataset}: no images to process (splits {splits})")
    from pacs.metric.common.device import process_state, resolve_device

    state = process_state(config.device)
    device = resolve_device(config.device)
    captioner = captioner or BlipCaptioner.load(config.captioner, config.caption_max_length,
                                                config.caption_num_beams, device, config.dtype)
    image_generator = image_generator or DiffusionImages.load(
        config.text_to_image, config.safety_checker, config.num_inference_steps, config.guidance_scale,
        config.image_size, device, config.dtype)
    out = Path(config.output_dir)
    (out / "gen_images").mkdir(parents=True, exist_ok=True)
    part = out / f"manifest.part{state.process_index:03d}.jsonl"
    with state.split_between_processes(images) as shard:
        _generate_shard(list(shard), part, out, config, captioner, image_generator, state.is_local_main_process)
    state.wait_for_everyone()
    manifest = out / "manifest.jsonl"
    if state.is_main_process:
        _merge_shards(images, out, manifest, skipped=len(missing), config=config)
    state.wait_for_everyone()
    return manifest


def _generate_shard(images: list[SourceImage], part: Path, out: Path, config: PositivesConfig,
                    captioner: ImageCaptioner, image_generator: ImageGenerator, show: bool) -> None:
    done = _read_all_done(out)
    todo = [image for image in images
            if not (image.image_id in done and len(done[image.image_id]) == len(image.captions)
                    and all((out / row["gen_image"]).is_file() for row in done[image.image_id]))]
    if len(todo) < len(images):
        logger.info("resuming: %d of %d image(s) of this shard already done", len(images) - len(todo), len(images))
    progress = tqdm(total=len(todo), desc="positives", disable=not show)
    if part.is_file() and part.stat().st_size and not part.read_bytes().endswith(b"\n"):
        with open_no_follow(part, "a", encoding="utf-8") as handle:
            handle.write("\n")  # a torn last line (interrupted run) stays ignorable on its own line
    with open_no_follow(part, "a", encoding="utf-8") as handle:  # never through a link planted in the folder
        for batch in _chunks(todo, config.batch_size):
            previous = {image.image_id: done.get(image.image_id, []) for image in batch}
            need_caption = [image for image in batch if not previous[image.image_id]]
            generated = captioner([load_rgb(image.path) for image in need_caption]) if need_caption else []
            gen_captions = {image.image_id: text for image, text in zip(need_caption, generated)}
            for image in batch:
                if previous[image.image_id]:
                    gen_captions[image.image_id] = previous[image.image_id][0]["gen_caption"]
            pending = [(image, k) for image in batch for k in range(len(image.captions))
                       if not (out / "gen_images" / f"{image.caption_ids[k]}.png").is_file()]
            for chunk in _chunks(pending, config.batch_size):
                prompts = [image.captions[k] for image, k in chunk]
                seeds = [caption_seed(config.seed, image.caption_ids[k]) for image, k in chunk]
                for (image, k), picture in zip(chunk, image_generator(prompts, seeds)):
                    with atomic_path(out / "gen_images" / f"{image.caption_ids[k]}.png") as tmp:
                        picture.save(tmp, format="PNG")
            for image in batch:
                written = {row["caption_id"] for row in done.get(image.image_id, [])}
                for k, caption in enumerate(image.captions):
                    if image.caption_ids[k] in written:
                        continue
                    row = {"image_id": image.image_id, "caption_id": image.caption_ids[k],
                           "real_image": str(image.path), "caption": caption,
                           "gen_caption": gen_captions[image.image_id],
                           "gen_image": f"gen_images/{image.caption_ids[k]}.png",
                           "split": "train" if image.split == "restval" else image.split,
                           "seed": caption_seed(config.seed, image.caption_ids[k])}
                    handle.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
                handle.flush()
            progress.update(len(batch))
    progress.close()


def _merge_shards(images: list[SourceImage], out: Path, manifest: Path, skipped: int, config: PositivesConfig) -> None:
    by_caption = {str(row["caption_id"]): row for rows in _read_all_done(out).values() for row in rows}
    lines = []
    for image in images:
        for caption_id in image.caption_ids:
            if caption_id not in by_caption:
                raise InputError(f"image {image.image_id} caption {caption_id}: no generated positives found in "
                                 f"the shard files of {out}")
            lines.append(json.dumps(by_caption[caption_id], ensure_ascii=False, allow_nan=False))
    with atomic_path(manifest) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    from pacs.metric.common.config import to_dict

    write_json_atomic(out / "positives_meta.json", {
        "n_images": len(images), "n_pairs": len(lines), "skipped_missing_images": skipped,
        "captioner": config.captioner, "text_to_image": config.text_to_image, "seed": config.seed,
        "seed_rule": "per caption: first 4 bytes of sha256('<seed>:<caption_id>')",
        "provenance": provenance(config=to_dict(config), seed=config.seed)})
    logger.info("wrote %s (%d pairs over %d images)", manifest, len(lines), len(images))
