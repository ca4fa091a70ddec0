"""pacs.eval: text metrics (pycocoevalcap, fast CIDEr-D), fluency measures and human-correlation benchmarks."""
from eval.cider import CiderD, DocumentFrequency, cider_d, cider_df

__all__ = ["CiderD", "DocumentFrequency", "cider_d", "cider_df"]
