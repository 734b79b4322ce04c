"""``python -m trainer``: the README's main job (see ``trainer.main``)."""

import sys

from trainer.main import main

sys.exit(main(sys.argv[1:]))
