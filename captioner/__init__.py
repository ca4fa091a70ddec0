"""pacs.captioner: encoder-decoder Transformer over CLIP grid features, trained with XE then SCST."""
