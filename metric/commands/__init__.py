"""The `pacs` sub-commands of the metric package (score, train-metric, generate-positives, score-video, export) and the shared model options."""
