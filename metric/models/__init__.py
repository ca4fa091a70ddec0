"""CLIP-family models: open_clip backbones, official PAC-S / PAC-S++ and pacs checkpoint formats, LoRA merge, preprocessing, tokenizer, pruned forward, grid features, export."""
