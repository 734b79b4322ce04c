"""A saturated CPU, as on a training node: busy processes started before the run and stopped after it.

    with CpuLoad(per_core=4):      # 4 busy processes per core (8 on this machine's 2 cores)
        ...                        # the run under test: it competes with them for every core

Each process spins in pure Python at normal priority, as dataloaders, reward workers and compilation do. They are
this object's own children, in its session (Linux's autogroup then weighs them against the run as on a node without
it, one task each, not one group each), and are ended by their pids (never by name).

    python -m tracklane.testing.cpu_load [PER_CORE]   # load until interrupted (a shell's job, for trying things)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import TracebackType

# Spins; every ~10 M turns (about half a second) it looks whether its parent is still the one that started it, and
# ends when not: a load whose owner was killed does not outlive it.
_SPIN = """
import os, sys
parent, turns = int(sys.argv[1]), 0
while True:
    turns += 1
    if turns % 10_000_000 == 0 and os.getppid() != parent:
        break
"""


class CpuLoad:
    def __init__(self, per_core: float = 4.0) -> None:
        """``per_core``: busy processes per CPU core (``os.cpu_count()``); 0: none (a quiet machine, to compare)."""
        self.processes = round(per_core * (os.cpu_count() or 1))
        self._children: list[subprocess.Popen[bytes]] = []

    def start(self) -> CpuLoad:
        for _ in range(self.processes):
            self._children.append(subprocess.Popen([sys.executable, "-c", _SPIN, str(os.getpid())],
                                                   stdin=subprocess.DEVNULL))
        if self._children:
            time.sleep(0.2)  # running before what comes next starts
        return self

    def stop(self) -> None:
        for child in self._children:
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
        for child in self._children:
            child.wait()
        self._children.clear()

    def cpu_s(self) -> float:
        """CPU seconds the busy processes have had so far (what they took from everything else)."""
        total = 0.0
        for child in self._children:
            try:
                with open(f"/proc/{child.pid}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, IndexError, ValueError):  # ended, or not Linux
                pass
        return total

    def __enter__(self) -> CpuLoad:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # ends its load too (a shell's `kill`)
    load = CpuLoad(float(argv[0]) if argv else 4.0).start()
    print(f"{load.processes} busy processes; Ctrl-C ends them", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        load.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
