"""Internal. The ``tracklane`` command: argparse in ``main``; ``inspect``, ``replay`` and ``migrate`` each in a module."""
