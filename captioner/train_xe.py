"""Deprecated import path (removed in pacs 0.4): use `captioner.modeling.train_xe`."""
from metric.common.deprecation import alias_module

alias_module(__name__, "captioner.modeling.train_xe")
