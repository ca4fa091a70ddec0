"""pacs.metric: CLIP-family dual encoders, CLIP-S / PAC-S / PAC-S++ scores, checkpoints, and PAC-S++ training."""
