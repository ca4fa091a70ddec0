"""Caption data sets: one registry (`DATASETS`) of loaders returning a common `CaptionDataset`, and the streaming
forms of the large ones (`DATASET_STREAMS`, read by `stream_dataset` one item at a time)."""
from pacs.captioner.data import cc3m, flickr8k_raw, karpathy, nocaps, vizwiz  # noqa: F401  (register the loaders)
from pacs.captioner.data.datasets import (
    DATASETS,
    CaptionDataset,
    CaptionItem,
    DatasetConfig,
    get_dataset_loader,
    load_dataset,
    load_dataset_config,
    register_dataset,
)
from pacs.captioner.data.streaming import DATASET_STREAMS, StreamedDataset, register_dataset_stream, stream_dataset

__all__ = ["DATASETS", "DATASET_STREAMS", "CaptionDataset", "CaptionItem", "DatasetConfig", "StreamedDataset",
           "get_dataset_loader", "load_dataset", "load_dataset_config", "register_dataset", "register_dataset_stream",
           "stream_dataset"]
