"""The captions of a training set in flat storage: one UTF-8 buffer and offset arrays, no Python object per caption.

`CaptionStore.from_items(items)` keeps every image id (one string per image) and every caption as a slice of
one `bytes` buffer (`caption_offsets`, int64) grouped by image (`image_offsets`, int64). Two read-only
sequence views give the trainers what they take, built lazily per index:

* `store.captions()` — every caption, image by image (the vocabulary's text);
* `store.pairs()` — `(image_id, caption)` per caption, image by image (XE's `train`);
* `store.reference_sets()` — `(image_id, [captions])` per image (SCST's `train`);
* `store.reference_map()` — `{image_id: [captions]}` (the SCST reward's `train_references`).

`ImagePaths` keeps `{image_id: image path}` the same way (one buffer of ids, one of paths).

Decoding an index costs one slice of the buffer, so the views are O(1) per item and hold nothing per caption.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from captioner.data.datasets import CaptionItem


def own_copy(text: str) -> str:
    """A new string object equal to `text` (so that keeping it does not keep the memory of the object it came from,
    e.g. a data set item's id allocated among the items' objects)."""
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def _own_value(value: Any) -> Any:
    """`value` rebuilt from new objects (strings, lists, dicts; other values as they are)."""
    if isinstance(value, str):
        return own_copy(value)
    if isinstance(value, list):
        return [_own_value(v) for v in value]
    if isinstance(value, dict):
        return {_own_value(k): _own_value(v) for k, v in value.items()}
    return value


def detached_items(items: Iterable[CaptionItem]) -> list[CaptionItem]:
    """Equal copies of data set items made of new objects: keeping a few items of a large loaded data set then
    keeps no memory page of the objects of the others (its id, caption and path strings are all copied)."""
    return [CaptionItem(own_copy(item.image_id),
                        None if item.image_path is None else Path(own_copy(str(item.image_path))),
                        [own_copy(caption) for caption in item.captions], own_copy(item.split),
                        _own_value(item.extra))
            for item in items]


class CaptionStore:
    """Image ids and their captions in one buffer (`blob`) with int64 offsets (`caption_offsets`, `image_offsets`)."""

    def __init__(self, image_ids: Sequence[str], blob: bytes, caption_offsets: np.ndarray,
                 image_offsets: np.ndarray) -> None:
        self.image_ids = list(image_ids)
        self.blob = blob
        self.caption_offsets = np.asarray(caption_offsets, dtype=np.int64)
        self.image_offsets = np.asarray(image_offsets, dtype=np.int64)
        if len(self.image_offsets) != len(self.image_ids) + 1:
            raise ValueError(f"{len(self.image_ids)} image ids but {len(self.image_offsets) - 1} caption groups")
        if int(self.image_offsets[-1]) != len(self.caption_offsets) - 1:
            raise ValueError("image_offsets do not end at the number of captions")

    @classmethod
    def from_pairs(cls, groups: Iterable[tuple[str, Sequence[str]]], own_ids: bool = False) -> CaptionStore:
        """A store of `(image_id, captions)` groups (e.g. dataset items), read once, in order.

        `own_ids=True` makes the id strings new objects (made last, together) instead of keeping the input's: the
        store then keeps no memory page of the input's objects once they are freed (a pipeline that drops its
        loaded data set), at the cost of one string per image.
        """
        ids: list = []
        parts: list[bytes] = []
        lengths: list[int] = []
        per_image: list[int] = []
        for image_id, captions in groups:
            ids.append(str(image_id).encode("utf-8", "surrogatepass") if own_ids else str(image_id))
            per_image.append(len(captions))
            for caption in captions:
                data = caption.encode("utf-8")
                parts.append(data)
                lengths.append(len(data))
        caption_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(np.asarray(lengths, dtype=np.int64), out=caption_offsets[1:])
        image_offsets = np.zeros(len(per_image) + 1, dtype=np.int64)
        np.cumsum(np.asarray(per_image, dtype=np.int64), out=image_offsets[1:])
        blob = b"".join(parts)
        del parts, lengths, per_image
        if own_ids:  # made last, together: they share no memory page with the input's or the temporary objects
            ids = [data.decode("utf-8", "surrogatepass") for data in ids]
        return cls(ids, blob, caption_offsets, image_offsets)

    @classmethod
    def from_items(cls, items: Iterable[Any], own_ids: bool = False) -> CaptionStore:
        """A store of data set items (`CaptionItem`s: `image_id`, `captions`); `own_ids` as in `from_pairs`."""
        return cls.from_pairs(((item.image_id, item.captions) for item in items), own_ids)

    @property
    def num_images(self) -> int:
        """Number of images."""
        return len(self.image_ids)

    @property
    def num_captions(self) -> int:
        """Number of captions over all images."""
        return len(self.caption_offsets) - 1

    def caption(self, index: int) -> str:
        """Caption number `index` (captions numbered image by image)."""
        start, end = self.caption_offsets[index], self.caption_offsets[index + 1]
        return self.blob[start:end].decode("utf-8")

    def captions_of(self, image: int) -> list[str]:
        """The captions of image number `image`."""
        return [self.caption(k) for k in range(int(self.image_offsets[image]), int(self.image_offsets[image + 1]))]

    def image_of_caption(self) -> np.ndarray:
        """Image number of every caption (int32 array, caption order)."""
        counts = np.diff(self.image_offsets)
        return np.repeat(np.arange(self.num_images, dtype=np.int32), counts)

    def captions(self) -> CaptionTexts:
        """Every caption, image by image (e.g. the vocabulary's training text)."""
        return CaptionTexts(self)

    def pairs(self) -> CaptionPairs:
        """`(image_id, caption)` per caption (XE's training examples)."""
        return CaptionPairs(self)

    def reference_sets(self) -> ReferenceSets:
        """`(image_id, captions)` per image (SCST's training examples)."""
        return ReferenceSets(self)

    def reference_map(self) -> ReferenceMap:
        """`{image_id: captions}` (the CIDEr-D reward's training references)."""
        return ReferenceMap(self)

    def nbytes(self) -> int:
        """Bytes held by the buffer and the offset arrays (the image id strings aside)."""
        return len(self.blob) + self.caption_offsets.nbytes + self.image_offsets.nbytes


def _index(index: int, length: int) -> int:
    if not isinstance(index, (int, np.integer)):
        raise TypeError(f"indices must be integers or slices, not {type(index).__name__}")
    position = int(index) + length if index < 0 else int(index)
    if not 0 <= position < length:
        raise IndexError(f"index {index} out of range for {length} items")
    return position


class CaptionTexts(Sequence):
    """Every caption of a `CaptionStore` (caption order), decoded on access."""

    def __init__(self, store: CaptionStore) -> None:
        self.store = store

    def __len__(self) -> int:
        return self.store.num_captions

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self.store.caption(_index(index, len(self)))

    def __iter__(self) -> Iterator[str]:
        for position in range(len(self)):
            yield self.store.caption(position)


class CaptionPairs(Sequence):
    """`(image_id, caption)` per caption of a `CaptionStore`, decoded on access."""

    def __init__(self, store: CaptionStore) -> None:
        self.store = store
        self.image_index = store.image_of_caption()

    def __len__(self) -> int:
        return self.store.num_captions

    @overload
    def __getitem__(self, index: int) -> tuple[str, str]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, str]]: ...

    def __getitem__(self, index: int | slice) -> tuple[str, str] | list[tuple[str, str]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        position = _index(index, len(self))
        return self.store.image_ids[int(self.image_index[position])], self.store.caption(position)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for position in range(len(self)):
            yield self[position]

    def image_ids(self) -> list[str]:
        """Every distinct image id (store order)."""
        return list(self.store.image_ids)


class ReferenceSets(Sequence):
    """`(image_id, captions)` per image of a `CaptionStore` (SCST's training examples), decoded on access."""

    def __init__(self, store: CaptionStore) -> None:
        self.store = store

    def __len__(self) -> int:
        return self.store.num_images

    @overload
    def __getitem__(self, index: int) -> tuple[str, list[str]]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, list[str]]]: ...

    def __getitem__(self, index: int | slice) -> tuple[str, list[str]] | list[tuple[str, list[str]]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        position = _index(index, len(self))
        return self.store.image_ids[position], self.store.captions_of(position)

    def __iter__(self) -> Iterator[tuple[str, list[str]]]:
        for position in range(len(self)):
            yield self[position]


class ReferenceMap(Mapping):
    """`{image_id: captions}` over a `CaptionStore` (the SCST reward's `train_references`), decoded on access."""

    def __init__(self, store: CaptionStore) -> None:
        self.store = store
        self._position = {image_id: i for i, image_id in enumerate(store.image_ids)}

    def __len__(self) -> int:
        return self.store.num_images

    def __getitem__(self, image_id: str) -> list[str]:
        return self.store.captions_of(self._position[image_id])

    def __iter__(self) -> Iterator[str]:
        return iter(self.store.image_ids)


class ImagePaths(Mapping):
    """`{image_id: Path | None}` held as two UTF-8 buffers (ids, paths) with int64 offsets; the id strings and
    `Path`s are made on access.

    Iterating keys or `items()` goes in order without any lookup table; the id -> position dict is built on the
    first lookup by id.
    """

    def __init__(self, pairs: Iterable[tuple[str, Any]]) -> None:
        """`pairs`: `(image_id, path or None)` with distinct ids, in order."""
        ids: list[bytes] = []
        parts: list[bytes] = []
        lengths: list[int] = []
        for image_id, path in pairs:
            ids.append(str(image_id).encode("utf-8", "surrogatepass"))
            data = b"" if path is None else str(path).encode("utf-8", "surrogateescape")
            parts.append(data)
            lengths.append(-1 if path is None else len(data))
        sizes = np.asarray(lengths, dtype=np.int64)
        self.has_path = sizes >= 0
        self.offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(np.maximum(sizes, 0), out=self.offsets[1:])
        self.blob = b"".join(parts)
        self.id_offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)), out=self.id_offsets[1:])
        self.id_blob = b"".join(ids)
        self._position: dict[str, int] | None = None

    @classmethod
    def from_items(cls, items: Iterable[Any]) -> ImagePaths:
        """The paths of data set items (`CaptionItem`s: `image_id`, `image_path`); a repeated id keeps its first
        place and its last path, as a dict built from the items would."""
        items = items if isinstance(items, list) else list(items)
        if len({item.image_id for item in items}) != len(items):
            return cls({item.image_id: item.image_path for item in items}.items())
        return cls((item.image_id, item.image_path) for item in items)

    def image_id(self, position: int) -> str:
        """The id of image number `position`."""
        start, end = self.id_offsets[position], self.id_offsets[position + 1]
        return self.id_blob[start:end].decode("utf-8", "surrogatepass")

    def path(self, position: int) -> Path | None:
        """The path of image number `position`."""
        if not self.has_path[position]:
            return None
        return Path(self.blob[self.offsets[position]:self.offsets[position + 1]].decode("utf-8", "surrogateescape"))

    def __len__(self) -> int:
        return len(self.id_offsets) - 1

    def __getitem__(self, image_id: str) -> Path | None:
        if self._position is None:
            self._position = {key: i for i, key in enumerate(self)}
        return self.path(self._position[image_id])

    def __iter__(self) -> Iterator[str]:
        return (self.image_id(i) for i in range(len(self)))

    def items(self) -> Iterator[tuple[str, Path | None]]:  # type: ignore[override]
        """`(image_id, path)` in order (no lookup by id)."""
        return ((self.image_id(i), self.path(i)) for i in range(len(self)))

    def values(self) -> Iterator[Path | None]:  # type: ignore[override]
        """Every path in order."""
        return (self.path(i) for i in range(len(self)))
