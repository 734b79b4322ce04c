"""The hook's old name (``worker_process_setup_hook=pipeline.verl_dropin.install``), kept for launch lines that use it.

The code lives in ``pipeline.verl.dropin``.
"""

from pipeline.verl.dropin import install, uninstall

__all__ = ["install", "uninstall"]
