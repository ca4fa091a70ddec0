"""PAC-S++ training: the trainer, losses, training data, positives, GradCache, distributed helpers and the correlation hook."""
