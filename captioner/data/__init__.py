"""Caption data sets: one registry (`DATASETS`) of loaders returning a common `CaptionDataset`."""
from captioner.data import cc3m, flickr8k_raw, karpathy, nocaps, vizwiz  # noqa: F401  (register the loaders)
from captioner.data.datasets import (
    DATASETS,
    CaptionDataset,
    CaptionItem,
    DatasetConfig,
    get_dataset_loader,
    load_dataset,
    load_dataset_config,
    register_dataset,
)

__all__ = ["DATASETS", "CaptionDataset", "CaptionItem", "DatasetConfig", "get_dataset_loader", "load_dataset",
           "load_dataset_config", "register_dataset"]
