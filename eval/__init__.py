"""pacs.eval: text metrics (pycocoevalcap, fast CIDEr-D), fluency measures and human-correlation benchmarks."""
