"""``python -m dvml``: the ``dvml`` command line."""

import sys

from dvml.cli import main

if __name__ == "__main__":
    sys.exit(main())
