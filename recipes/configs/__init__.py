"""The default configs (`recipes/configs/*.yaml`), installed as the package `pacs.configs` (see setup.cfg).

Look them up by name with `pacs.metric.common.config_files` (`pacs train --config demo_smoke`).
"""
