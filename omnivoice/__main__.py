"""`python -m omnivoice ...` is the `omnivoice` command."""

import sys

from omnivoice.cli import main

if __name__ == "__main__":
    sys.exit(main())
