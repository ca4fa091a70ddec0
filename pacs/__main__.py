"""`python -m pacs`: the `pacs` console script."""
import sys

from pacs.cli import main

if __name__ == "__main__":
    sys.exit(main())
