"""``python -m agentloop.cli``: the ``agentloop`` console script."""

import sys

from agentloop.cli import main

sys.exit(main())
