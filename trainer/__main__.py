"""``python -m trainer``: the README's main job."""

import sys

from trainer.demo import main

sys.exit(main(sys.argv[1:]))
