"""Deprecated import path (removed in pacs 0.4): use `captioner.modeling.training`."""
from metric.common.deprecation import alias_module

alias_module(__name__, "captioner.modeling.training")
