"""Image normalisation constants of released CLIP weights (plain tuples: importing this loads no torch)."""
from __future__ import annotations

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
"""Per-channel RGB mean of OpenAI CLIP's preprocessing."""
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
"""Per-channel RGB standard deviation of OpenAI CLIP's preprocessing."""
