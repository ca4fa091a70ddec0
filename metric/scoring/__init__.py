"""Scores and scoring: CLIP-S / PAC-S / PAC-S++ formulas, the Scorer with its embedding cache, score inputs, the metric registry, torchmetrics metrics and the one-call API."""
