"""One way to fan work out to processes, one rule for every child process, one default worker count.

Every child traceforge starts (these workers, a simulator) runs in its own process group and is
killed with its whole group when the run ends early (an error, Ctrl-C, SIGTERM, SIGHUP): a
terminal's signal to our group never reaches a child half-way, and nothing a child started
outlives us. Workers also die with their parent (Linux: PR_SET_PDEATHSIG), even on kill -9.

Workers are forked (they inherit the caller's module state: planned programs, open sets), so
callers put what the workers need in a module global before calling ``fan_out``, or name it as
``Shared`` state (an install function and its value): installed here before the fork, and on
Ray (``plan --ray``, base/ray_pool.py) sent once and installed once per worker process. Each worker
has its own pipe and takes one item at a time: no lock is shared between processes, so a
worker that dies at any instant (a signal, the OOM killer) cannot hang the others or the
parent, as a dead worker holding multiprocessing.Pool's queue lock hangs Pool.terminate().

Where ``fan_out`` runs is one setting, ``ray_pool.workers_for(ray, jobs)``, that a command enters
around its work: this machine's processes, or Ray. Either way the items are drawn from the caller's iterator
at the same moments, by the results consumed (``ahead``), never by which worker is free first, so
a caller whose next item depends on the results so far (plan's branch and bound) gets the same
answer on any backend and under any load.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol, TypeVar

from traceforge.base.errors import UserError

T = TypeVar("T")
R = TypeVar("R")

_PR_SET_PDEATHSIG = 1
AHEAD = 4  # items drawn per worker beyond the next result due: bounds the results held for order


def ahead(jobs: int) -> int:
    """Items drawn from the caller's iterator beyond the results it has consumed: item i is drawn
    once result i - ahead(jobs) has been taken, whichever worker ends first. One worker draws one
    at a time, as a loop in this process does (so Ray's one worker does what one process does)."""
    return 1 if jobs <= 1 else AHEAD * jobs


@dataclass(frozen=True)
class Shared:
    """Read-only state every task of a fan-out needs: ``install(value)`` makes it current in a
    process (sets the caller's module global). Forked workers inherit it, installed here first;
    Ray sends ``value`` once (ray.put) and installs it once per worker process. ``install`` must be
    a module-level function and ``value`` picklable (what it pickles to is what Ray moves)."""

    install: Callable[[Any], None]
    value: Any


class Backend(Protocol):
    """Somewhere other than this machine's forked processes to run a fan-out (base/ray_pool.py)."""

    shares_files: bool  # whether its workers see this machine's files (a path written there is here)

    def fan_out(self, func: Callable[[Any], Any], items: Iterable[Any], jobs: int,
                initializer: Callable[[], None] | None, shared: Shared | None) -> Iterator[Any]: ...


_backend: Backend | None = None  # None: this machine's forked processes


@contextlib.contextmanager
def running_on(backend: Backend) -> Iterator[None]:
    """Every fan_out in the block runs on ``backend``."""
    global _backend
    saved, _backend = _backend, backend
    try:
        yield
    finally:
        _backend = saved


def workers_share_files() -> bool:
    """Whether fan_out's workers see this machine's files: a task that writes a file must send
    the bytes back instead when they do not (Ray's workers may be on other machines)."""
    return _backend is None or _backend.shares_files


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


def kill_group(pgid: int) -> None:
    """SIGKILL a child's whole process group (the child and whatever it started); gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def die_with_parent() -> None:
    """In a child: the kernel kills us when the parent dies, even by kill -9 (Linux; elsewhere
    best effort)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# The signals that stop a run (Ctrl-C, kill, a closed terminal).
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold the stop signals while a child is started: one arriving half-way would leave a child
    no one knows to kill. It is delivered when the block ends, once the child is on record."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def release_signals() -> None:
    """In a child started under signals_held: take signals again."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _init_worker(then: Callable[[], None] | None = None) -> None:
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # our own group (the parent sets it too: whichever runs first)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it kills us
    for stop in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(stop) is not signal.SIG_IGN:  # ignored by the caller (nohup): stays ignored
            signal.signal(stop, signal.SIG_DFL)
    release_signals()
    die_with_parent()
    if then is not None:
        then()


def _worker(conn: Connection, func: Callable, initializer: Callable[[], None] | None) -> None:
    _init_worker(initializer)
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):  # the parent is done with us
            return
        try:
            reply = ("ok", func(item))
        except BaseException as exc:  # the parent re-raises it
            reply = ("error", exc)
        try:
            conn.send(reply)
        except Exception as exc:  # a result or an exception that does not pickle
            conn.send(("error", RuntimeError(f"a worker's answer could not be sent back: {exc!r}")))


def fan_out(func: Callable[[T], R], items: Iterable[T], jobs: int,
            initializer: Callable[[], None] | None = None, shared: Shared | None = None) -> Iterator[R]:
    """func over items in ``jobs`` forked processes, results in item order; ``initializer`` runs
    once in each worker first, ``shared`` is installed for them (see Shared). A worker's exception
    is raised here; a worker that dies is an error naming its exit; stopping the iteration early,
    or any exception in the caller, kills every worker's process group at once. With one job, in
    this process. Inside ``running_on`` (ray_pool.workers_for), on that backend instead, same order."""
    if _backend is not None:
        return _backend.fan_out(func, items, jobs, initializer, shared)
    if shared is not None:
        shared.install(shared.value)
    if jobs <= 1:
        if initializer is not None:
            initializer()
        return map(func, items)
    return _forked(func, items, jobs, initializer)


def _forked(func: Callable[[T], R], items: Iterable[T], jobs: int,
            initializer: Callable[[], None] | None) -> Iterator[R]:
    ctx = multiprocessing.get_context("fork")
    workers: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    try:
        for _ in range(max(1, jobs)):
            mine, theirs = ctx.Pipe()
            with signals_held():
                proc = ctx.Process(target=_worker, args=(theirs, func, initializer), daemon=True)
                proc.start()
                workers.append((proc, mine))
            theirs.close()
            pid = proc.pid
            assert pid is not None  # started
            with contextlib.suppress(OSError):  # the child may have done it, or already exited
                os.setpgid(pid, pid)
        yield from _dispatch(items, workers)
    finally:  # done, failed or abandoned: every result is in, or none is wanted any more
        for child, conn in workers:
            if child.pid is not None:
                kill_group(child.pid)
            conn.close()
        for child, _ in workers:
            child.join()


def _dispatch(items: Iterable[T], workers: list) -> Iterator:
    source = iter(items)
    window = ahead(len(workers))
    idle = [conn for _, conn in workers]
    proc_of = {id(conn): proc for proc, conn in workers}
    busy: dict[int, tuple[Connection, int]] = {}  # id(conn) -> (conn, item index)
    drawn: deque[tuple[int, object]] = deque()  # (index, item) drawn, waiting for an idle worker
    done: dict[int, object] = {}
    count = due = 0
    exhausted = False
    while True:
        # Drawn by the results yielded alone (ahead): the caller's iterator sees the same state
        # whichever worker ends first.
        while not exhausted and count < due + window:
            try:
                drawn.append((count, next(source)))
            except StopIteration:
                exhausted = True
                break
            count += 1
        while idle and drawn:
            conn = idle.pop()
            index, item = drawn.popleft()
            conn.send(item)
            busy[id(conn)] = (conn, index)
        if due in done:
            yield done.pop(due)
            due += 1
            continue
        if not busy:
            return
        for conn in wait([c for c, _ in busy.values()]):
            assert isinstance(conn, Connection)
            try:
                kind, value = conn.recv()
            except (EOFError, OSError):
                proc = proc_of[id(conn)]
                proc.join(1)
                how = f"signal {-proc.exitcode}" if proc.exitcode and proc.exitcode < 0 else f"exit {proc.exitcode}"
                raise UserError(f"a worker process died ({how}); nothing was written: rerun, or lower --jobs "
                                "if the machine ran out of memory") from None
            _, index = busy.pop(id(conn))
            idle.append(conn)
            if kind == "error":
                raise value
            done[index] = value
