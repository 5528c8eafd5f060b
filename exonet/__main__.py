"""``python -m exonet`` is the ``exonet`` command."""

import sys

from exonet.cli import main

if __name__ == "__main__":
    sys.exit(main())
