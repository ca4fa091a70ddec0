"""On-disk cache of CLIP grid features keyed by image id: extraction (accelerate, resumable) and a reader.

Layout of a cache folder::

    meta.json                     backbone name + fingerprint, feature_dim, tokens, dtype
    shards/shard-<hex>.safetensors  tensors named by image id, each [tokens, feature_dim]
    index.json                    {image_id: shard file name} (rebuilt from the shards when stale)

Each shard is written atomically, so an interrupted extraction loses at most the shard in progress;
running again skips every id already stored. Processes of an `accelerate launch` split the ids
(`ids[rank::world]`) and write their own shards. Training reads features only from here (never CLIP).

Reading copies each requested tensor out of its shard with one positioned read (`os.pread`) instead of mapping
the shard into memory: the process holds the features of the batch it asked for, not the pages of every shard
it has touched (those stay in the OS page cache, shared and reclaimable, out of the process's resident memory).
A reader keeps at most `OPEN_SHARDS` shards open (their file and their parsed safetensors header).
"""
from __future__ import annotations

import json
import logging
import os
import stat
import struct
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from pacs.metric.common.device import autocast_dtype, check_precision
from pacs.metric.common.errors import InputError, MissingResourceError, NonFiniteError
from pacs.metric.common.io import atomic_path, write_json_atomic
from pacs.metric.common.parallel import ordered_map, resolve_workers
from pacs.metric.common.spill import DiskArray, DiskStrings, IdLookup, id_hash
from pacs.metric.models.grid import grid_feature_dim, visual_grid_features
from pacs.metric.models.preprocess import open_image
from pacs.metric.scoring import decode_pool

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8}
OPEN_SHARDS = 32  # shards a reader keeps open (file descriptor + parsed header) at a time


class _Shard:
    """One open shard: its file descriptor and, per tensor name, (dtype, shape, absolute byte range)."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO planted as a shard: refused, not waited on
        try:
            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                raise ValueError("not a regular file (a FIFO or a device?)")
            (length,) = struct.unpack("<Q", os.pread(self.fd, 8, 0))
            if length > 100_000_000:
                raise ValueError(f"header of {length} bytes")
            header = json.loads(os.pread(self.fd, length, 8))
            self.entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                begin, end = entry["data_offsets"]
                self.entries[name] = (_SAFETENSORS_DTYPES[entry["dtype"]], tuple(entry["shape"]),
                                      8 + length + int(begin), 8 + length + int(end))
        except Exception:
            os.close(self.fd)
            raise

    def read(self, name: str) -> torch.Tensor:
        """The tensor `name`, copied out of the file (KeyError when absent, ValueError when truncated)."""
        dtype, shape, begin, end = self.entries[name]
        data = os.pread(self.fd, end - begin, begin)
        if len(data) != end - begin:
            raise ValueError(f"{len(data)} of {end - begin} bytes")
        return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)

    def close(self) -> None:
        """Close the file."""
        os.close(self.fd)


class FeatureCache:
    """Read-only view of a feature cache folder: `get(ids) -> FloatTensor[B, R, D]` via memory-mapped shards."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        meta_path = self.folder / "meta.json"
        if not meta_path.is_file():
            raise MissingResourceError(f"no feature cache at {self.folder} (missing meta.json): extract features first")
        self.meta: dict[str, Any] = _read_meta(meta_path)
        self.index = ShardIndex.of_folder(self.folder)
        self._handles: OrderedDict[str, _Shard] = OrderedDict()  # the open shards, least recently used first

    @property
    def feature_dim(self) -> int:
        """Width of each grid token."""
        return int(self.meta["feature_dim"])

    @property
    def num_tokens(self) -> int:
        """Number of grid tokens R per image."""
        return int(self.meta["tokens"])

    @property
    def fingerprint(self) -> str:
        """Fingerprint of the backbone that produced the features."""
        return str(self.meta.get("fingerprint", ""))

    def __contains__(self, image_id: object) -> bool:
        return str(image_id) in self.index

    def __len__(self) -> int:
        return len(self.index)

    def ids(self) -> list[str]:
        """All cached image ids (sorted; a list of every id: for listings, not for training loops)."""
        return sorted(self.index)

    def missing(self, image_ids: Iterable[str]) -> list[str]:
        """The ids among `image_ids` that are not cached."""
        return [str(i) for i in image_ids if str(i) not in self.index]

    def _handle(self, shard: str) -> _Shard:
        if shard in self._handles:
            self._handles.move_to_end(shard)
            return self._handles[shard]
        path = self.folder / "shards" / shard
        try:
            handle = _Shard(path)
        except Exception as error:  # noqa: BLE001 - a missing, truncated or malformed file
            raise InputError(f"feature shard {path} is unreadable ({error}); delete it and re-extract (pacs "
                             "train re-runs a features stage whose files changed)") from None
        self._handles[shard] = handle
        if len(self._handles) > OPEN_SHARDS:
            self._handles.popitem(last=False)[1].close()
        return handle

    def close(self) -> None:
        """Close the shards this reader has open (it reopens them when asked for features again)."""
        while self._handles:
            self._handles.popitem()[1].close()

    def __del__(self) -> None:
        handles = getattr(self, "_handles", None)
        while handles:
            handles.popitem()[1].close()

    def get(self, image_ids: Sequence[str]) -> torch.Tensor:
        """Stack the features of `image_ids` as float32 `[B, R, D]` (InputError naming an uncached id, NonFiniteError
        naming the cache, the image id and its shard for features holding NaN / inf)."""
        tensors = []
        for image_id in image_ids:
            shard = self.index.get(str(image_id))
            if shard is None:
                raise InputError(f"image id {image_id!r} is not in the feature cache {self.folder}")
            try:
                tensor = self._handle(shard).read(str(image_id))
            except InputError:
                raise
            except Exception as error:  # noqa: BLE001 - a shard truncated or rewritten after it was opened
                raise InputError(f"feature shard {self.folder / 'shards' / shard} is unreadable at image id "
                                 f"{image_id!r} ({error}); delete it and re-extract") from None
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                # named here, not later as a "diverged" training whose learning rate is blamed
                raise NonFiniteError(f"feature cache {self.folder}: the features of image id {image_id!r} (shard "
                                     f"{self.folder / 'shards' / shard}) hold NaN or infinite values; delete the "
                                     "shard and re-extract")
            tensors.append(tensor)
        return torch.stack(tensors).float()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handles"] = OrderedDict()
        state["index"] = None  # on disk in this process: the new one lists the shards again
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.index = ShardIndex.of_folder(self.folder)


class ShardIndex:
    """`{image_id: shard name}` without a Python object per id: the ids on disk (`DiskStrings`), an `IdLookup`
    (12 bytes per id) and one int32 shard number per id in memory."""

    def __init__(self, index: Mapping[str, str] | Iterable[tuple[str, str]]) -> None:
        """`index`: `{image_id: shard name}` or its `(image_id, shard name)` pairs (distinct ids)."""
        names: dict[str, int] = {}
        self.ids = DiskStrings(errors="surrogatepass")
        numbers = DiskArray(np.int32)
        pairs = index.items() if isinstance(index, Mapping) else index
        for image_id, shard in pairs:
            self.ids.append(image_id)
            numbers.append(names.setdefault(shard, len(names)))
        self.ids.finish()
        self.shard_numbers = numbers.finish().to_numpy()
        numbers.close()
        self.shards = list(names)
        self._lookup = IdLookup(self.ids)

    @classmethod
    def of_folder(cls, folder: Path) -> ShardIndex:
        """The index of a cache folder, read from its shards' headers one shard at a time (no dict of every id;
        a repeated id keeps its last shard, as `_scan_index` does)."""
        shard_dir = folder / "shards"
        shards = sorted(p.name for p in shard_dir.glob("shard-*.safetensors")) if shard_dir.is_dir() else []

        def pairs() -> Iterator[tuple[str, str]]:
            seen_twice = _ids_in_several_shards(shard_dir, shards)
            for shard in shards:
                for image_id in _shard_keys(shard_dir / shard):
                    if image_id not in seen_twice or seen_twice[image_id] == shard:
                        yield image_id, shard

        return cls(pairs())

    def get(self, image_id: str, default: str | None = None) -> str | None:
        """The shard holding `image_id`, or `default`."""
        position = self._lookup.position(image_id)
        return default if position is None else self.shards[int(self.shard_numbers[position])]

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._lookup

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)


def _shard_keys(path: Path) -> list[str]:
    """The tensor names (image ids) in one shard, from its header (InputError naming an unreadable shard)."""
    try:
        handle = _Shard(path)
    except Exception as error:  # noqa: BLE001 - a missing, truncated or malformed file
        raise InputError(f"feature shard {path} is unreadable ({error}); delete it and re-extract") from None
    handle.close()
    return list(handle.entries)


def _ids_in_several_shards(shard_dir: Path, shards: list[str]) -> dict[str, str]:
    """`{image_id: last shard}` for the ids found in more than one shard (a re-extraction; none normally), from
    the 64-bit hashes of every id (8 bytes per id) and a second look at the shards of the colliding ones."""
    hashes = np.fromiter((id_hash(image_id) for shard in shards for image_id in _shard_keys(shard_dir / shard)),
                         dtype=np.uint64)
    hashes.sort()
    repeated = {int(h) for h in hashes[1:][hashes[1:] == hashes[:-1]]}
    del hashes
    if not repeated:
        return {}
    last: dict[str, str] = {}
    count: dict[str, int] = {}
    for shard in shards:
        for image_id in _shard_keys(shard_dir / shard):
            if id_hash(image_id) in repeated:
                last[image_id] = shard
                count[image_id] = count.get(image_id, 0) + 1
    return {image_id: shard for image_id, shard in last.items() if count[image_id] > 1}


def _scan_index(folder: Path) -> dict[str, str]:
    """Map image id -> shard name by listing the shards (authoritative; index.json is only a convenience)."""
    index: dict[str, str] = {}
    index_path = folder / "index.json"
    shard_dir = folder / "shards"
    shards = sorted(p.name for p in shard_dir.glob("shard-*.safetensors")) if shard_dir.is_dir() else []
    if index_path.is_file():
        try:
            stored = json.loads(index_path.read_text(encoding="utf-8"))
            if sorted(set(stored["shards"])) == shards and isinstance(stored["ids"], dict):
                return {str(key): str(value) for key, value in stored["ids"].items()}
        except (OSError, ValueError, RecursionError, KeyError, TypeError):
            logger.warning("%s is unreadable; listing the shards instead", index_path)
    for shard in shards:
        try:
            with safe_open(str(shard_dir / shard), framework="pt") as handle:
                index.update(dict.fromkeys(handle.keys(), shard))  # safe_open has keys() but no __iter__
        except Exception as error:  # noqa: BLE001 - safetensors raises several types for corrupt files
            raise InputError(f"feature shard {shard_dir / shard} is unreadable ({error}); delete it and re-extract") from None
    return index


def _read_meta(path: Path) -> dict[str, Any]:
    """A cache's meta.json as a dict; InputError naming the file when it is not one."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:
        raise InputError(f"{path} is unreadable ({error}); delete the feature cache and re-extract") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path} is not a feature-cache description; delete the feature cache and re-extract")
    return meta


def _write_index(folder: Path) -> dict[str, str]:
    index = _scan_index(folder)
    write_json_atomic(folder / "index.json", {"shards": sorted(set(index.values())), "ids": index}, indent=None)
    return index


def _check_meta(folder: Path, meta: dict[str, Any]) -> None:
    path = folder / "meta.json"
    if path.is_file():
        old = _read_meta(path)
        for key in ("fingerprint", "feature_dim", "tokens", "dtype", "mixed_precision"):
            if old.get(key) != meta.get(key):
                raise InputError(f"{path}: the cache holds features with {key}={old.get(key)!r}, this run asks for "
                                 f"{meta.get(key)!r}; use another cache folder")


def load_pixels(backbone: Any, images: Mapping[str, str | os.PathLike], ids: Sequence[str],
                workers: int | str = "auto") -> torch.Tensor:
    """The backbone's preprocessed pixels `[len(ids), 3, H, W]`; an unreadable image is an error naming id and path.

    `workers` threads decode the images (`pacs.metric.common.parallel`: the same pixels, bit for bit, in order).
    """
    return torch.stack(list(iter_pixels(backbone, images, ids, workers)))


def iter_pixels(backbone: Any, images: Mapping[str, str | os.PathLike], ids: Sequence[str],
                workers: int | str = "auto", ahead: int = 0) -> Iterator[torch.Tensor]:
    """The preprocessed pixels `[3, H, W]` of `ids`, in order, decoded up to `ahead` early: by `workers` processes
    for many ids (`pacs.metric.scoring.decode_pool`), by threads for a few; the same pixels, bit for bit."""

    def decode(image_id: str) -> torch.Tensor:
        return backbone.preprocess(_read_image(images, image_id))

    count = resolve_workers(workers)
    batch = max(1, ahead // 2) if ahead else 64
    return decode_pool.ordered_pixels(decode, list(ids), count,
                                      lambda: tuple(backbone.preprocess(Image.new("RGB", (8, 8))).shape),
                                      batch_size=batch, fallback=lambda: ordered_map(decode, ids, count, ahead))


def _read_image(images: Mapping[str, str | os.PathLike], image_id: str) -> Image.Image:
    """The image of `image_id`, read by `pacs score`'s rule (`pacs.metric.models.preprocess.open_image`): an unreadable
    file or a decompression bomb (a 30000×30000 PNG) is one InputError naming the id and the file."""

    try:
        return open_image(images[image_id])
    except InputError as error:
        raise InputError(f"image {image_id!r}: {error}") from None


def extract_features(backbone: Any, images: Mapping[str, str | os.PathLike], cache_dir: str | os.PathLike,
                     batch_size: int = 32, shard_size: int = 512, dtype: str = "float32",
                     accelerator: Any = None, mixed_precision: str = "no", workers: int | str = "auto") -> FeatureCache:
    """Extract grid features of `images` ({image_id: path}) into `cache_dir`, skipping ids already cached.

    `backbone` is a `pacs.metric.models.backbones.Backbone` (model + preprocess). With an `accelerate.Accelerator`,
    each process handles `ids[rank::world]`; the returned cache is complete on every process. `mixed_precision`
    bf16 / fp16 runs the tower under `torch.autocast` (fp32 weights; the features are stored in `dtype`).
    `workers` threads (default: one per core) decode the next batch while the tower encodes the current one; the
    features are those of the serial path, bit for bit.
    """
    import contextlib


    if dtype not in _DTYPES:
        raise InputError(f"feature dtype {dtype!r} unknown (known: {', '.join(_DTYPES)})")
    folder = Path(cache_dir)
    rank = accelerator.process_index if accelerator is not None else 0
    world = accelerator.num_processes if accelerator is not None else 1
    is_main = rank == 0
    device = accelerator.device if accelerator is not None else torch.device("cpu")
    check_precision(mixed_precision, device, "features.mixed_precision")
    low = autocast_dtype(mixed_precision)

    def grid_of(pixels: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=low) if low is not None else contextlib.nullcontext():
            return visual_grid_features(backbone, pixels.to(device)).float()
    missing_files = [f"{i} ({p})" for i, p in images.items() if not Path(p).is_file()]
    if missing_files:
        raise InputError(f"{len(missing_files)} image file(s) not found, e.g. {', '.join(missing_files[:3])}")

    probe_id = next(iter(images), None)
    if probe_id is None:
        raise InputError("no images to extract features from")
    pixels = backbone.preprocess(_read_image(images, probe_id)).unsqueeze(0)
    tokens = grid_of(pixels).shape[1]
    meta = {"backbone": getattr(backbone, "name", "unknown"), "fingerprint": getattr(backbone, "fingerprint", ""),
            "feature_dim": grid_feature_dim(backbone), "tokens": int(tokens), "dtype": dtype}
    if low is not None:  # recorded only when set: caches of full-precision runs keep their meta
        meta["mixed_precision"] = mixed_precision
    _check_meta(folder, meta)
    if is_main:
        (folder / "shards").mkdir(parents=True, exist_ok=True)
        write_json_atomic(folder / "meta.json", meta)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    done = set(_scan_index(folder))
    if accelerator is not None:  # every process must see the same `done` before anyone writes a new shard
        accelerator.wait_for_everyone()
    todo = [str(i) for i in sorted(images, key=str) if str(i) not in done][rank::world]
    logger.info("features: %d cached, %d to extract on process %d/%d", len(done), len(todo), rank, world)
    writer = ShardWriter(folder, shard_size)
    progress = tqdm(total=len(todo), desc="grid features", unit="img", disable=not is_main)
    loaded = iter_pixels(backbone, images, todo, workers, ahead=2 * batch_size)
    for start in range(0, len(todo), batch_size):
        chunk = todo[start:start + batch_size]
        pixels = torch.stack([next(loaded) for _ in chunk])
        grid = grid_of(pixels).to(_DTYPES[dtype]).cpu()
        for image_id, tensor in zip(chunk, grid):
            writer.add(image_id, tensor)
        progress.update(len(chunk))
    writer.close()
    progress.close()
    if accelerator is not None:
        accelerator.wait_for_everyone()
    if is_main:
        _write_index(folder)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    return FeatureCache(folder)


MAX_SHARD_BYTES = 256 * 1024 * 1024  # a shard never holds more, whatever shard_size asks for


class ShardWriter:
    """Writes features into shards of at most `shard_size` images and MAX_SHARD_BYTES bytes: the memory it holds is
    one shard, however many features pass through it."""

    def __init__(self, folder: Path, shard_size: int = 512) -> None:
        if shard_size < 1:
            raise InputError(f"shard_size must be >= 1, got {shard_size}", parameter="shard_size")
        self.folder, self.shard_size = folder, int(shard_size)
        self.pending: dict[str, torch.Tensor] = {}
        self.bytes = 0
        self.shards_written = 0

    def add(self, image_id: str, tensor: torch.Tensor) -> None:
        """Queue one image's features; a full shard is written at once."""
        tensor = tensor.detach().cpu().contiguous()
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.bytes + size > MAX_SHARD_BYTES:
            self.flush()
        self.pending[str(image_id)] = tensor
        self.bytes += size
        if len(self.pending) >= self.shard_size:
            self.flush()

    def flush(self) -> None:
        """Write the queued features as one shard (atomically)."""
        if not self.pending:
            return
        target = self.folder / "shards" / f"shard-{uuid.uuid4().hex[:16]}.safetensors"
        with atomic_path(target) as tmp:
            save_file(self.pending, str(tmp))
        self.pending, self.bytes = {}, 0
        self.shards_written += 1

    def close(self) -> None:
        """Write what is left."""
        self.flush()


def write_feature_cache(features: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                        cache_dir: str | os.PathLike, meta: Mapping[str, Any] | None = None,
                        shard_size: int = 512) -> FeatureCache:
    """Store precomputed features ({image_id: [R, D]} or an iterable of (image_id, [R, D]) pairs, e.g. a generator
    reading another extractor's output) as a cache, in shards of bounded size."""
    folder = Path(cache_dir)
    pairs = iter(features.items() if isinstance(features, Mapping) else features)
    first_pair = next(pairs, None)
    if first_pair is None:
        raise InputError("write_feature_cache: no features given")
    first = first_pair[1]
    full_meta = {"backbone": "external", "fingerprint": "", "feature_dim": int(first.shape[-1]),
                 "tokens": int(first.shape[0]), "dtype": str(first.dtype).replace("torch.", "")}
    full_meta.update(meta or {})
    _check_meta(folder, full_meta)
    (folder / "shards").mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "meta.json", full_meta)
    writer = ShardWriter(folder, shard_size)
    writer.add(str(first_pair[0]), first)
    for image_id, tensor in pairs:
        if tuple(tensor.shape) != tuple(first.shape):
            raise InputError(f"write_feature_cache: image {image_id!r} has features of shape {tuple(tensor.shape)}, "
                             f"the first one {tuple(first.shape)}")
        writer.add(str(image_id), tensor)
    writer.close()
    _write_index(folder)
    return FeatureCache(folder)
