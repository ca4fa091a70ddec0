"""The captions of a training set on disk: no Python object per caption and no memory per caption.

`CaptionStore.from_items(items, folder)` streams every image id and caption into unnamed files in `folder`
(`pacs.metric.common.spill`: `DiskStrings`, `DiskArray`), grouped by image (`image_offsets`). Read-only sequence views
give the trainers what they take, read from disk per index (one or two `pread`s) or in blocks when iterated:

* `store.captions()` — every caption, image by image (the vocabulary's text);
* `store.pairs()` — `(image_id, caption)` per caption, image by image (XE's `train`);
* `store.reference_sets()` — `(image_id, [captions])` per image (SCST's `train`);
* `store.reference_map()` — `{image_id: [captions]}` (the SCST reward's `train_references`; 12 bytes per image
  in memory for the lookup by id).

`ImagePaths` keeps `{image_id: image path}` the same way. The process's memory thus stays the same from 16k to
113k training images (docs/performance.md, `bench/bench_scale.py`); the files' pages are the kernel's page cache.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from pacs.metric.common.spill import DiskArray, DiskStrings, IdLookup


class CaptionStore:
    """Image ids and their captions on disk (`DiskStrings`), grouped by image through `image_offsets` (int64, on
    disk too): the store keeps fixed-size buffers in memory whatever the number of captions."""

    def __init__(self, image_ids: DiskStrings, texts: DiskStrings, image_offsets: DiskArray,
                 image_of_caption: DiskArray) -> None:
        self.image_ids = image_ids
        self.texts = texts
        self.image_offsets = image_offsets
        self.image_index = image_of_caption
        if len(image_offsets) != len(image_ids) + 1:
            raise ValueError(f"{len(image_ids)} image ids but {len(image_offsets) - 1} caption groups")
        if int(image_offsets[-1]) != len(texts) or len(image_of_caption) != len(texts):
            raise ValueError("image_offsets do not end at the number of captions")

    @classmethod
    def builder(cls, folder: str | os.PathLike | None = None) -> CaptionStoreBuilder:
        """A builder taking one `(image_id, captions)` group at a time (`add`), then `finish()` -> the store."""
        return CaptionStoreBuilder(folder)

    @classmethod
    def from_pairs(cls, groups: Iterable[tuple[str, Sequence[str]]],
                   folder: str | os.PathLike | None = None) -> CaptionStore:
        """A store of `(image_id, captions)` groups (e.g. dataset items), read once, in order, streamed to unnamed
        files in `folder` (the system's temporary folder when None)."""
        builder = cls.builder(folder)
        for image_id, captions in groups:
            builder.add(image_id, captions)
        return builder.finish()

    @classmethod
    def from_items(cls, items: Iterable[Any], folder: str | os.PathLike | None = None) -> CaptionStore:
        """A store of data set items (`CaptionItem`s: `image_id`, `captions`); `folder` as in `from_pairs`."""
        return cls.from_pairs(((item.image_id, item.captions) for item in items), folder)

    @property
    def num_images(self) -> int:
        """Number of images."""
        return len(self.image_ids)

    @property
    def num_captions(self) -> int:
        """Number of captions over all images."""
        return len(self.texts)

    def caption(self, index: int) -> str:
        """Caption number `index` (captions numbered image by image)."""
        return self.texts[index]

    def captions_of(self, image: int) -> list[str]:
        """The captions of image number `image`."""
        start, end = self.image_offsets[image:image + 2]
        return self.texts.span(int(start), int(end))

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


class CaptionStoreBuilder:
    """Writes a `CaptionStore` one image at a time into unnamed files of `folder`."""

    def __init__(self, folder: str | os.PathLike | None = None) -> None:
        self.image_ids = DiskStrings(folder, errors="surrogatepass")
        self.texts = DiskStrings(folder)
        self.image_offsets = DiskArray(np.int64, folder)
        self.image_index = DiskArray(np.int32, folder)
        self.image_offsets.append(0)
        self.num_images = 0
        self._captions = 0

    def add(self, image_id: str, captions: Sequence[str]) -> None:
        """Append one image and its captions."""
        self.image_ids.append(str(image_id))
        for caption in captions:
            self.texts.append(caption)
        self._captions += len(captions)
        self.image_offsets.append(self._captions)
        self.image_index.extend(np.full(len(captions), self.num_images, dtype=np.int32))
        self.num_images += 1

    def finish(self) -> CaptionStore:
        """The store (the builder is spent)."""
        return CaptionStore(self.image_ids.finish(), self.texts.finish(), self.image_offsets.finish(),
                            self.image_index.finish())


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
        return iter(self.store.texts)


class CaptionPairs(Sequence):
    """`(image_id, caption)` per caption of a `CaptionStore`, decoded on access."""

    def __init__(self, store: CaptionStore) -> None:
        self.store = store
        self.image_index = store.image_index  # image number of every caption (int32, on disk)

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
        store = self.store
        for image, image_id in enumerate(store.image_ids):
            for caption in store.captions_of(image):
                yield image_id, caption

    def image_ids(self) -> DiskStrings:
        """Every distinct image id (store order; on disk, read by index or in order)."""
        return self.store.image_ids


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
        for position, image_id in enumerate(self.store.image_ids):
            yield image_id, self.store.captions_of(position)


class ReferenceMap(Mapping):
    """`{image_id: captions}` over a `CaptionStore` (the SCST reward's `train_references`), decoded on access."""

    def __init__(self, store: CaptionStore) -> None:
        self.store = store
        self._lookup = IdLookup(store.image_ids)  # 12 bytes per image in memory

    def __len__(self) -> int:
        return self.store.num_images

    def __getitem__(self, image_id: str) -> list[str]:
        position = self._lookup.position(image_id) if isinstance(image_id, str) else None
        if position is None:
            raise KeyError(image_id)
        return self.store.captions_of(position)

    def __contains__(self, image_id: object) -> bool:
        return image_id in self._lookup

    def values(self) -> Iterator[list[str]]:  # type: ignore[override]
        """Every image's captions, in order (no lookup by id)."""
        return (captions for _, captions in self.store.reference_sets())

    def items(self) -> Iterator[tuple[str, list[str]]]:  # type: ignore[override]
        """`(image_id, captions)` in order (no lookup by id)."""
        return iter(self.store.reference_sets())

    def __iter__(self) -> Iterator[str]:
        return iter(self.store.image_ids)


class ImagePaths(Mapping):
    """`{image_id: Path | None}` with ids and paths on disk (`DiskStrings`); the id strings and `Path`s are made on
    access, and a lookup by id goes through an `IdLookup` (12 bytes per image in memory, built on first use)."""

    def __init__(self, pairs: Iterable[tuple[str, Any]], folder: str | os.PathLike | None = None) -> None:
        """`pairs`: `(image_id, path or None)` with distinct ids, in order; stored in unnamed files in `folder`."""
        builder = ImagePathsBuilder(folder)
        for image_id, path in pairs:
            builder.add(image_id, path)
        self.ids, self.paths, self.has_path = builder.tables()
        self._lookup: IdLookup | None = None

    @classmethod
    def builder(cls, folder: str | os.PathLike | None = None) -> ImagePathsBuilder:
        """A builder taking one `(image_id, path)` at a time (`add`), then `finish()` -> the mapping."""
        return ImagePathsBuilder(folder)

    @classmethod
    def from_items(cls, items: Iterable[Any], folder: str | os.PathLike | None = None) -> ImagePaths:
        """The paths of data set items (`CaptionItem`s: `image_id`, `image_path`); a repeated id keeps its first
        place and its last path, as a dict built from the items would."""
        items = items if isinstance(items, list) else list(items)
        if len({item.image_id for item in items}) != len(items):
            return cls({item.image_id: item.image_path for item in items}.items(), folder)
        return cls(((item.image_id, item.image_path) for item in items), folder)

    def image_id(self, position: int) -> str:
        """The id of image number `position`."""
        return self.ids[position]

    def path(self, position: int) -> Path | None:
        """The path of image number `position`."""
        return Path(self.paths[position]) if self.has_path[position] else None

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, image_id: str) -> Path | None:
        if self._lookup is None:
            self._lookup = IdLookup(self.ids)
        position = self._lookup.position(image_id) if isinstance(image_id, str) else None
        if position is None:
            raise KeyError(image_id)
        return self.path(position)

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def items(self) -> Iterator[tuple[str, Path | None]]:  # type: ignore[override]
        """`(image_id, path)` in order (no lookup by id)."""
        return zip(self.ids, self.values())

    def values(self) -> Iterator[Path | None]:  # type: ignore[override]
        """Every path in order."""
        flags = (bool(flag) for block in self.has_path.blocks() for flag in block)
        return (Path(path) if flag else None for path, flag in zip(self.paths, flags))


class ImagePathsBuilder:
    """Writes an `ImagePaths` one image at a time into unnamed files of `folder`."""

    def __init__(self, folder: str | os.PathLike | None = None) -> None:
        self.ids = DiskStrings(folder, errors="surrogatepass")
        self.paths = DiskStrings(folder, errors="surrogateescape")
        self.has_path = DiskArray(np.bool_, folder)

    def add(self, image_id: str, path: Any) -> None:
        """Append one image id and its path (None: no file)."""
        self.ids.append(str(image_id))
        self.paths.append("" if path is None else str(path))
        self.has_path.append(path is not None)

    def tables(self) -> tuple[DiskStrings, DiskStrings, DiskArray]:
        """The finished tables (ids, paths, whether each has a path)."""
        return self.ids.finish(), self.paths.finish(), self.has_path.finish()

    def finish(self) -> ImagePaths:
        """The mapping (the builder is spent)."""
        mapping = ImagePaths.__new__(ImagePaths)
        mapping.ids, mapping.paths, mapping.has_path = self.tables()
        mapping._lookup = None
        return mapping
