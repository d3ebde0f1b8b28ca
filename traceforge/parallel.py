"""One way to fan work out to processes, and one default worker count.

Workers are forked (they inherit the caller's module state: planned programs, open sets), so
callers put what the workers need in a module global before calling ``fan_out``. Workers
ignore Ctrl-C and die with their parent (Linux: PR_SET_PDEATHSIG); when the parent stops
early (an error, Ctrl-C, SIGTERM) the pool is terminated at once instead of draining its
queue, so no chunk is written after the run gave up.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from traceforge.errors import UserError

T = TypeVar("T")
R = TypeVar("R")

_PR_SET_PDEATHSIG = 1


def cores() -> int:
    """CPUs this process may run on (its affinity mask, as taskset and cgroups set it)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def resolve_jobs(jobs: int | None, flag: str = "--jobs") -> int:
    """The worker count for a --jobs value: default all cores, never more than the cores
    (more processes than CPUs only cost memory and, at the process limit, never finish)."""
    if jobs is None:
        return cores()
    if jobs < 1:
        raise UserError(f"{flag} must be at least 1, got {jobs}")
    return min(jobs, cores())


def _init_worker(then: Callable[[], None] | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it terminates us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:  # die with the parent, even on kill -9 (Linux only; elsewhere best effort)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if then is not None:
        then()


def fan_out(func: Callable[[T], R], items: Iterable[T], jobs: int,
            initializer: Callable[[], None] | None = None) -> Iterator[R]:
    """func over items in ``jobs`` forked processes, results in item order; ``initializer`` runs
    once in each worker first. Stopping the iteration early, or any exception in the caller,
    kills the workers at once."""
    pool = multiprocessing.get_context("fork").Pool(jobs, initializer=_init_worker, initargs=(initializer,))
    try:
        yield from pool.imap(func, items)
    finally:  # done, failed or abandoned: every result is in, or none is wanted any more
        pool.terminate()
        pool.join()
