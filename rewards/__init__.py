"""pacs.rewards: a registry of SCST reward functions built on metric/ and eval/."""
