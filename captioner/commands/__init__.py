"""The `pacs` sub-commands of the captioner package (caption, train)."""
