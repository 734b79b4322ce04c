"""``python -m tracklane inspect|replay SPOOL_DIR``: the same as the ``tracklane`` command (pipeline/cli/main.py)."""

import sys

from tracklane.cli.main import main

sys.exit(main())
