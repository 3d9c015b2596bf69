"""``python -m agentloop.cli``: the ``agentloop`` console script."""

import sys

from agentloop.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
