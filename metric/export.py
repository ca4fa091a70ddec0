"""Deprecated import path (removed in pacs 0.4): use `metric.training.export`."""
from metric.common.deprecation import alias_module

alias_module(__name__, "metric.training.export")
