"""The default configs (`recipes/configs/*.yaml`), installed as the package `pacs_configs` (see setup.cfg).

Look them up by name with `metric.common.config_files` (`pacs train --config demo_smoke`).
"""
