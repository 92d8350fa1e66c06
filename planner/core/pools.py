"""Worker processes that a Ctrl-C stops cleanly.

A Ctrl-C reaches every process of the terminal's group. Left to themselves, workers die mid-task
while the pool's manager thread is still handing out results, which can print an
``InvalidStateError`` traceback after the command has ended. Here the workers ignore the
interrupt; the parent, which alone acts on it, ends its workers and goes on raising
``KeyboardInterrupt`` (the command exits 130).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

#: Fewer scenarios (or jobs) than this run in this process: starting workers (≈ 1 s each,
#: importing OR-Tools and the catalogs) costs more than it saves.
MIN_SCENARIOS_FOR_PROCESSES = 4


def default_workers() -> int:
    """Worker processes: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def ignore_interrupts() -> None:
    """A worker's initializer: Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def stopped_on_interrupt(pool: ProcessPoolExecutor) -> Iterator[None]:
    """Within the block, any exception (a Ctrl-C included) ends the pool's workers before it
    propagates; the futures not done then fail with ``BrokenProcessPool``.

    They are not cancelled first: Python 3.11's pool sets that failure on every pending future,
    cancelled or not, and a cancelled one raises ``InvalidStateError`` in its manager thread."""
    try:
        yield
    except BaseException:
        # No public call ends a pool's workers: its process table is the only handle on them.
        processes = getattr(pool, "_processes", None) or {}
        for proc in list(processes.values()):
            proc.terminate()
        pool.shutdown(wait=False)
        raise
