"""``python -m exonet.validate``: the same as ``exonet validate``."""

import sys

from exonet.validate.command import main

if __name__ == "__main__":
    sys.exit(main())
