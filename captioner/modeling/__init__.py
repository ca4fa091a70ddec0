"""The captioner itself: model, vocabulary, decoding, grid features, XE and SCST training loops, checkpoints."""
