"""Runs built on the captioner: the recipe pipeline and its stages, evaluation tables, process launching."""
