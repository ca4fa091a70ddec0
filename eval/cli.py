"""Deprecated import path (removed in pacs 0.4): use `eval.commands.correlate`."""
from metric.common.deprecation import alias_module

alias_module(__name__, "eval.commands.correlate")
