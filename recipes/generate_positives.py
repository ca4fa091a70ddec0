"""Generate the synthetic positives of PAC-S / PAC-S++: a BLIP caption per image, a Stable Diffusion image per caption.

    accelerate launch recipes/generate_positives.py --config recipes/configs/generate_positives.yaml [key=value ...]

Shards the images over the launched processes and resumes where it stopped. Needs the `generate` extra
(diffusers); the models come from the hub or from local copies (`captioner=PATH text_to_image=PATH`).
The same as `pacs generate-positives`.
"""
from __future__ import annotations

import sys

from pacs import cli as pacs_cli

if __name__ == "__main__":
    sys.exit(pacs_cli.main(["generate-positives", *sys.argv[1:]]))
