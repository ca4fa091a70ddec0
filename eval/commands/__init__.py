"""The `pacs` sub-commands of the eval package (correlate, evaluate, report)."""
