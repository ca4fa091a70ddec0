"""One seed for python, numpy and torch."""
from __future__ import annotations

import random

import numpy as np


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's and torch's global generators with `seed`."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    import torch

    torch.manual_seed(seed)
