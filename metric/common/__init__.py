"""Small utilities shared by every pacs package: errors, atomic I/O, YAML configs, provenance, seeding, paths."""
