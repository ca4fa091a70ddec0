"""The demo's data: world items of every split, their images on disk, and lookups by image id."""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from pacs.captioner.demo.config import DemoWorldConfig
from pacs.captioner.demo.world import DemoWorld, Scene, WorldItem
from pacs.metric.common.config import to_dict
from pacs.metric.common.io import atomic_path, write_json_atomic

SPLITS = ("train", "val", "test")


@dataclass
class DemoData:
    """Items of every split (deterministic from the world config) and where their images are."""

    world: DemoWorld
    splits: dict[str, list[WorldItem]]
    image_dir: Path

    @classmethod
    def build(cls, config: DemoWorldConfig, image_dir: Path) -> DemoData:
        """Generate the items of every split (no rendering)."""
        world = DemoWorld(config)
        sizes = {"train": config.n_train, "val": config.n_val, "test": config.n_test}
        return cls(world=world, splits={s: world.items(s, n) for s, n in sizes.items()}, image_dir=image_dir)

    def image_path(self, image_id: str) -> Path:
        """The PNG of `image_id`."""
        return self.image_dir / f"{image_id}.png"

    def image_paths(self, split: str) -> dict[str, str]:
        """{image_id: path} of a split."""
        return {item.image_id: str(self.image_path(item.image_id)) for item in self.splits[split]}

    def scenes(self) -> dict[str, Scene]:
        """Ground-truth scene of every image id."""
        return {item.image_id: item.scene for items in self.splits.values() for item in items}

    def references(self) -> dict[str, list[str]]:
        """Reference captions of every image id."""
        return {item.image_id: item.references for items in self.splits.values() for item in items}


def render_images(data: DemoData) -> int:
    """Render every image of every split into `data.image_dir`, writing each file that is missing or differs from
    its rendering (a folder is never trusted blindly); how many were written."""
    data.image_dir.mkdir(parents=True, exist_ok=True)
    written = 0
    items = [item for split in data.splits.values() for item in split]
    for item in tqdm(items, desc="render world", unit="img"):
        buffer = io.BytesIO()
        data.world.render(item).save(buffer, format="PNG")
        target = data.image_path(item.image_id)
        if target.is_file() and target.read_bytes() == buffer.getvalue():
            continue
        with atomic_path(target) as tmp:
            tmp.write_bytes(buffer.getvalue())
        written += 1
    return written


def write_images(data: DemoData, folder: Path) -> dict[str, int]:
    """Render every image of every split into `data.image_dir` and describe the world in `folder/world.json`."""
    render_images(data)
    summary = {split: len(items) for split, items in data.splits.items()}
    write_json_atomic(folder / "world.json", {
        "config": to_dict(data.world.config), "counts": summary,
        "examples": [{"image_id": i.image_id, "references": i.references,
                      "objects": [vars(o) for o in i.scene.objects]} for i in data.splits["test"][:20]]})
    return summary
