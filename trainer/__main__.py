"""``python -m tracklane.trainer``: the README's main job (see ``tracklane.trainer.main``)."""

import os
import sys

# The main job's Ray is one node on this machine: on loopback (Ray reads this when it is imported, and otherwise
# binds the interface's address). Set it to 1 to let other machines join.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from tracklane.trainer.main import main  # noqa: E402  (after the variable: it imports Ray)

sys.exit(main(sys.argv[1:]))
