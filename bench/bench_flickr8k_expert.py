"""Benchmark: the full Flickr8k-Expert text-metric correlation, pacs vs one pycocoevalcap pass.

Baseline (what the official correlation scripts do): PTB-tokenize every judgment row, then pycocoevalcap's
Bleu(4), Meteor, Rouge and Cider over all 16,992 rows. pacs: `correlate` for bleu1, bleu4, rouge, meteor, cider
(one tokenizer call over distinct strings, each distinct pair scored once, fast CIDEr-D). Prints both times,
the ratio (target: pacs <= 1.2 x the baseline) and the Kendall taus of both, which must agree.

    PACS_SHARED=/work/shared python bench/bench_flickr8k_expert.py
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor.meteor import Meteor
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

from pacs.eval.benchmarks import RunContext, get_benchmark
from pacs.eval.benchmarks.flickr8k import load_raw
from pacs.eval.caption_scoring import MetricSuite
from pacs.eval.correlation import kendall

METRICS = ["bleu1", "bleu4", "rouge", "meteor", "cider"]


def pycocoevalcap_pass(folder: Path) -> dict[str, float]:
    """Tokenize and score every row with pycocoevalcap; Kendall tau-b per metric."""
    rows = load_raw(folder, "expert")
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({i: [{"caption": r} for r in refs] for i, refs in enumerate(rows.references)})
    res = tokenizer.tokenize({i: [{"caption": c}] for i, c in enumerate(rows.candidates)})
    bleu = Bleu(4).compute_score(gts, res, verbose=0)[1]
    meteor = Meteor()
    scores = {"bleu1": bleu[0], "bleu4": bleu[3], "rouge": Rouge().compute_score(gts, res)[1],
              "meteor": meteor.compute_score(gts, res)[1], "cider": Cider().compute_score(gts, res)[1]}
    del meteor
    return {name: kendall(values, rows.ratings, "b") for name, values in scores.items()}


def main() -> None:
    """Time both and print the table."""
    folder = Path(os.environ.get("PACS_SHARED", "../shared")) / "data" / "flickr8k"
    start = time.perf_counter()
    baseline = pycocoevalcap_pass(folder)
    t_coco = time.perf_counter() - start
    start = time.perf_counter()
    table = get_benchmark("flickr8k-expert").run(RunContext(folder, MetricSuite(METRICS)))
    t_pacs = time.perf_counter() - start
    print("Flickr8k-Expert, 16,992 judgments, BLEU-1/4, ROUGE-L, METEOR, CIDEr")
    print(f"{'implementation':<32} {'seconds':>9} {'ratio':>7}")
    print(f"{'pycocoevalcap (one pass)':<32} {t_coco:9.2f} {1.0:7.2f}")
    print(f"{'pacs correlate':<32} {t_pacs:9.2f} {t_pacs / t_coco:7.2f}")
    print(f"{'metric':<8} {'tau_b pycocoevalcap':>20} {'tau_b pacs':>11}")
    for name in METRICS:
        print(f"{name:<8} {baseline[name]:20.3f} {table[name]['tau_b']:11.3f}")


if __name__ == "__main__":
    main()
