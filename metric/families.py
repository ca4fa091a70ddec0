"""Deprecated import path (removed in pacs 0.4): use `metric.models.families`."""
from metric.common.deprecation import alias_module

alias_module(__name__, "metric.models.families", "metric.scoring.registry")
