"""Deprecated import path (removed in pacs 0.4): use `eval.training_hook`.

The hook that runs an eval benchmark during metric training is built by the caller and passed to
`metric.training.trainer.train_metric(correlation_hook=...)`; metric itself never imports eval.
"""
from metric.common.deprecation import alias_module

alias_module(__name__, "eval.training_hook")
