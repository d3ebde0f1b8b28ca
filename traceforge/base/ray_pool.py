"""`--ray local|auto|ADDRESS`: fan_out's work as Ray tasks, on this machine or on a cluster.

``workers_for`` enters ``connected`` when a command is given --ray; every pool.fan_out in the
block then runs here, with the same interface and the same order as the forked pool:

- Items are drawn from the caller's iterator by the results consumed (pool.ahead), never by
  which task ends first, and results are yielded in item order: plan's branch and bound, which
  chooses its next item from the results so far, gives the pool's answer byte for byte.
- At most ``jobs`` tasks run at once (``--jobs``; on a cluster its CPUs by default).
- A task gets no forked memory: the caller names its state as pool.Shared; its value goes to the
  object store once per fan-out caller (``ray.put``) and each worker process fetches and installs
  it once, then keeps it (plan's state rebuilds its spec builder there and warms its own memos).
  A task carries only its function and its install function by name, the state's reference, and
  its item: a layout or a candidate's values, a chunk of rank ids (benchmarks/bench_plan_ray.py
  measures them).
- Workers may be on other machines (``shares_files`` is False): a caller that writes files
  (write/writer.py) has its tasks send the bytes back and writes them here.
- Failures are one line: Ray not installed (exit 2), an address that does not answer, a cluster
  that refuses us or never finishes connecting, a head that stops answering mid-run (a thread
  probes it every POLL_S and interrupts the main thread, wherever Ray holds it: ``Watch``), a
  worker that dies, a node running another traceforge. Ctrl-C cancels the running tasks and
  leaves as without Ray (cli.user_errors: exit 130, nothing written).
- Ray's own messages (its C++ core writes to file descriptor 2) go to a log file instead of the
  terminal while we hold a Ray we started or joined; a failure names the file, which is kept.

Every traceforge module a task runs is imported by name on the worker: each node needs this
traceforge installed (``pip install 'traceforge[ray]'``, same version; a task checks it).
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import logging
import os
import re
import socket
import sys
import tempfile
import threading
import traceback
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from traceforge import __version__
from traceforge.base.errors import UserError
from traceforge.base.pool import Shared, ahead, resolve_jobs, running_on

NOT_INSTALLED = "Ray is not installed: pip install 'traceforge[ray]'"
WHERE = ("give local (start Ray on this machine), auto (the cluster this machine is a node of), "
         "ray://HOST:10001 (a cluster's Ray Client port) or HOST:6379 (its head, from one of its nodes)")
PROBE_S = 5.0  # an address that does not accept a connection in this long is unreachable
CONNECT_S = 60.0  # ray.init that has not connected by then never will (a token the cluster refuses, a Ray that never answers)
POLL_S = 2.0  # the head is probed this often while we hold Ray
LOST_AFTER = 3  # consecutive probes the head refuses: the cluster is gone
STUCK_S = 15.0  # after the interrupt, seconds the main thread has to leave Ray's call before we leave without it
_ADDRESS = re.compile(r"^(ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$", re.ASCII)


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError(NOT_INSTALLED) from None
    return ray


def parse_where(text: str) -> tuple[str, tuple[str, int] | None]:
    """(the address for ray.init, the (host, port) to probe first): local, auto, ray://HOST:PORT
    or HOST:PORT; anything else is refused."""
    text = text.strip()
    if text in ("local", "auto"):
        return text, None
    match = _ADDRESS.match(text)
    if not match or not 0 < int(match[3]) < 65536:
        raise UserError(f"--ray {text!r}: {WHERE}")
    return text, (match[2].strip("[]"), int(match[3]))


def _reachable(where: str, host: str, port: int, note: str = "") -> None:
    try:
        with socket.create_connection((host, port), timeout=PROBE_S):
            pass
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__).lower()
        raise UserError(f"--ray {where}: nothing answers at {host}:{port}{note} ({why}): start the cluster's head "
                        "('ray start --head', docs/scale.md) or check the address and port") from None


@contextlib.contextmanager
def _ray_output_to(log: Any) -> Iterator[None]:
    """File descriptor 2 (where Ray's C++ core writes) into ``log``; Python's sys.stderr keeps the
    terminal (a copy of the old descriptor) unless a caller already replaced it (a test's capture).
    An exception that ends one of Ray's threads (the Ray Client's, when its head dies) is written
    to the log too."""
    sys.stderr.flush()
    saved = os.dup(2)
    console = sys.stderr
    hook = threading.excepthook
    threading.excepthook = lambda args: traceback.print_exception(args.exc_type, args.exc_value, args.exc_traceback, file=log)
    os.dup2(log.fileno(), 2)
    if getattr(console, "fileno", None) is not None:
        with contextlib.suppress(OSError, ValueError):
            if console.fileno() == 2:
                sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1, encoding=console.encoding, errors="backslashreplace")
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        if sys.stderr is not console:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.close()
            sys.stderr = console
        os.dup2(saved, 2)
        os.close(saved)
        threading.excepthook = hook


@contextlib.contextmanager
def _deadline(seconds: float, message: Callable[[], str]) -> Iterator[None]:
    """Leave with ``message()`` (one line, exit 2) if the block has not ended in ``seconds``: a Ray
    call blocked in C++ cannot be interrupted, and nothing has been written yet."""

    def give_up() -> None:
        with contextlib.suppress(OSError, ValueError):
            os.write(_terminal_fd(), f"traceforge: error: {message()}\n".encode())  # the CLI's own form (cli.fail)
        os._exit(2)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _terminal_fd() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


@contextlib.contextmanager
def connected(where: str, jobs: int | None, flag: str = "--jobs") -> Iterator[int]:
    """Start or join Ray, run every fan_out of the block on it, and leave it as found: a local
    instance we started is stopped, a cluster only disconnected. Yields the worker count: the
    cores --jobs allows for local (Ray is started with that many CPUs), on a cluster --jobs or
    its CPUs. A Ray this process had already initialized (a program using traceforge as a
    library, the tests) is used as it is and left running."""
    address, probe = parse_where(where)
    if jobs is not None and jobs < 1:
        raise UserError(f"{flag} must be at least 1, got {jobs}")
    ray = _ray()
    if ray.is_initialized():
        with running_on(RayWorkers(ray, where, _health_address(ray, address, probe), None)):
            yield jobs if jobs is not None else _cpus(ray)
        return
    if address == "auto":
        probe = _found_by_auto()
    if probe is not None:
        _reachable(where, *probe, " (where auto found a cluster: RAY_ADDRESS, else the last 'ray start' on this machine)"
                   if address == "auto" else "")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a local instance reports nowhere
    quiet: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
    log = tempfile.NamedTemporaryFile("w", prefix="traceforge-ray-", suffix=".log", delete=False)  # noqa: SIM115
    backend: RayWorkers | None = None
    try:
        with _ray_output_to(log):
            warnings.filterwarnings("ignore", module=r"ray\.")  # its tips (FutureWarning on Ray 2.50) are not our answer
            if address == "local":
                ray.init(address="local", num_cpus=resolve_jobs(jobs, flag), include_dashboard=False, **quiet)
            else:
                log_name = f"Ray's messages: {log.name}"

                def said() -> str:
                    if probe is not None:
                        try:
                            _reachable(where, *probe)
                        except UserError:
                            return f"--ray {where}: the head at {probe[0]}:{probe[1]} stopped answering while Ray connected ({log_name})"
                    return (f"--ray {where}: Ray did not finish connecting in {CONNECT_S:.0f} s ({log_name}): if the cluster uses "
                            "token authentication, set RAY_AUTH_MODE=token and its token (docs/scale.md); check that it runs "
                            "this Ray version")

                try:
                    with _deadline(CONNECT_S, said):
                        ray.init(address=address, **quiet)
                except (ConnectionError, RuntimeError, ValueError, OSError) as exc:
                    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]  # a server's traceback: its last line
                    first = (lines[-1] if lines else type(exc).__name__)[:300]
                    backend = RayWorkers(ray, where, None, log.name)
                    backend.lost = True  # nothing to shut down; the log says why
                    raise UserError(f"--ray {where}: cannot connect: {first} (Ray's messages: {log.name})") from None
            for name in ("ray.util.client", "ray.util.client.logsclient", "ray.util.client.dataclient"):
                logging.getLogger(name).setLevel(logging.CRITICAL)  # the Ray Client's notes on a lost head: our line says it
            backend = RayWorkers(ray, where, _health_address(ray, address, probe), log.name)
            try:
                count = jobs if jobs is not None and address != "local" else _cpus(ray)
                with running_on(backend), Watch(backend):
                    yield count
            except KeyboardInterrupt:
                if backend.lost:  # Watch's interrupt, not Ctrl-C
                    raise UserError(backend.head_lost()) from None
                raise
            finally:
                if backend.lost:  # its shutdown would wait on the head that is gone; so would Ray's own at exit
                    atexit.unregister(ray.shutdown)
                    atexit.register(_leave_now)
                else:
                    ray.shutdown()
    finally:
        log.close()
        if backend is None or not backend.lost:  # kept only when a message names it
            with contextlib.suppress(OSError):
                os.unlink(log.name)


def _leave_now() -> None:
    """At exit, once the error line is out: Ray's core, whose cluster is gone, can crash tearing
    itself down (SIGSEGV after the line, seen with Ray 2.60); the exit code is the error's."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(2)


def _found_by_auto() -> tuple[str, int] | None:
    """The head `auto` would join (RAY_ADDRESS, else the last 'ray start' here), to probe: a
    cluster that is gone leaves its address behind. None when Ray's private helper does not say."""
    try:
        from ray._private.services import canonicalize_bootstrap_address

        found = canonicalize_bootstrap_address("auto")
    except Exception:  # none found (ray.init says so at once), or another Ray's internals
        return None
    match = _ADDRESS.match(str(found or ""))
    return (match[2].strip("[]"), int(match[3])) if match else None


@contextlib.contextmanager
def workers_for(ray: str | None, jobs: int | None, flag: str = "--jobs") -> Iterator[int]:
    """A command's worker count, with its fan-outs on Ray while the block lasts when ``ray`` names
    where (``--ray local|auto|ADDRESS``: base/ray_pool.py); without it this machine's processes,
    ``resolve_jobs(jobs)`` of them."""
    if ray is None:
        yield resolve_jobs(jobs, flag)
        return
    with connected(ray, jobs, flag) as count:
        yield count


def _cpus(ray: Any) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _health_address(ray: Any, address: str, probe: tuple[str, int] | None) -> tuple[str, int] | None:
    """Where the head answers while we wait: the Ray Client port we connected to, else the GCS."""
    if address.startswith("ray://"):
        return probe
    try:
        host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
        return host.strip("[]"), int(port)
    except Exception:  # a Ray whose context does not say: no probe, Ray's own errors stand
        return probe


class Watch:
    """A thread that probes the head every POLL_S while we hold Ray. After LOST_AFTER refusals in a
    row it marks the backend lost and interrupts the main thread (a KeyboardInterrupt, which
    ``connected`` turns into the one line: Ray checks signals in its waits, and the Ray Client's
    gRPC calls poll); if the main thread is still inside Ray's call STUCK_S later (a reconnect
    that never ends), it writes the line itself and leaves with exit 2, as a kill would: an
    output folder in progress is then left hidden, removed by the next run on it."""

    def __init__(self, backend: RayWorkers):
        self.backend = backend
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="traceforge-ray-watch", daemon=True)

    def __enter__(self) -> Watch:
        if self.backend.health is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()

    def _run(self) -> None:
        misses = 0
        while not self.stop.wait(POLL_S):
            try:
                with socket.create_connection(self.backend.health, timeout=POLL_S):  # type: ignore[arg-type]
                    misses = 0
            except OSError:
                misses += 1
            if misses >= LOST_AFTER:
                break
        else:
            return
        self.backend.lost = True
        _thread.interrupt_main()
        if self.stop.wait(STUCK_S):
            return
        with contextlib.suppress(OSError, ValueError):
            os.write(_terminal_fd(), f"traceforge: error: {self.backend.head_lost()}\n".encode())
        os._exit(2)


# -- in the worker ---------------------------------------------------------------------------

_installed: dict[Callable[[Any], None], str] = {}  # install function -> the object id installed with it
_initialized: set[Callable[[], None]] = set()


def _task(version: str, func: Callable[[Any], Any], shared: tuple[Callable[[Any], None], list] | None,
          initializer: Callable[[], None] | None, item: Any) -> Any:
    """One item in a Ray worker process: the state installed once per process, then func."""
    if version != __version__:
        raise UserError(f"a Ray worker on {socket.gethostname()} runs traceforge {__version__}, this is {version}: "
                        f"install traceforge {version} on every node")
    if initializer is not None and initializer not in _initialized:
        initializer()
        _initialized.add(initializer)
    if shared is not None:
        install, (ref,) = shared  # in a list: Ray hands a task its arguments' values, a nested reference as is
        if _installed.get(install) != ref.hex():
            import ray

            install(ray.get(ref))
            _installed[install] = ref.hex()
    return func(item)


# -- in the driver ---------------------------------------------------------------------------

class RayWorkers:
    """pool.Backend on Ray: see the module's docstring."""

    shares_files = False

    def __init__(self, ray: Any, where: str, health: tuple[str, int] | None, log: str | None):
        self.ray, self.where, self.health, self.log = ray, where, health, log
        self.lost = False
        self._remote = ray.remote(num_cpus=1)(_task)
        self._puts: dict[int, tuple[Any, Any]] = {}  # id(value) -> (value, its reference): one put per state

    def _put(self, value: Any) -> Any:
        if id(value) not in self._puts:
            self._puts = {id(value): (value, self.ray.put(value))}  # one state at a time: the last one's
        return self._puts[id(value)][1]

    def fan_out(self, func: Callable[[Any], Any], items: Iterable[Any], jobs: int,
                initializer: Callable[[], None] | None, shared: Shared | None) -> Iterator[Any]:
        carried = None if shared is None else (shared.install, [self._put(shared.value)])
        source = iter(items)
        window = ahead(jobs)
        drawn: deque[tuple[int, Any]] = deque()
        running: dict[Any, int] = {}  # reference -> item index
        done: dict[int, Any] = {}  # item index -> reference, ended
        count = due = 0
        exhausted = False
        try:
            while True:
                while not exhausted and count < due + window:  # as pool._dispatch: by the results yielded alone
                    try:
                        drawn.append((count, next(source)))
                    except StopIteration:
                        exhausted = True
                        break
                    count += 1
                while drawn and len(running) < max(1, jobs):
                    index, item = drawn.popleft()
                    running[self._remote.remote(__version__, func, carried, initializer, item)] = index
                if due in done:
                    value = self._result(done.pop(due))
                    due += 1
                    yield value
                    continue
                if not running:
                    return
                for ref in self._wait(list(running)):
                    done[running.pop(ref)] = ref
        finally:  # done, failed, interrupted or abandoned: nothing still runs for us
            if not self.lost:
                for ref in running:
                    with contextlib.suppress(Exception):
                        self.ray.cancel(ref, force=True)

    def _wait(self, refs: list[Any]) -> list[Any]:
        while True:  # in short waits: a signal (Ctrl-C, Watch's interrupt) is taken between them
            ready, _ = self.ray.wait(refs, num_returns=1, timeout=POLL_S)
            if ready:
                return ready

    def head_lost(self) -> str:
        assert self.health is not None
        return self._lost(f"its head at {self.health[0]}:{self.health[1]} stopped answering")

    def _lost(self, what: str) -> str:
        log = f"; Ray's messages: {self.log}" if self.log else ""
        return (f"the Ray cluster (--ray {self.where}) failed mid-run: {what}; nothing was written: rerun once it is "
                f"back{log}")

    def _result(self, ref: Any) -> Any:
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(ref)
        except exceptions.RayTaskError as exc:  # the task raised: its exception, as a forked worker's
            cause = getattr(exc, "cause", None)
            if isinstance(cause, ModuleNotFoundError) and (cause.name or "").startswith("traceforge"):
                raise UserError(f"--ray {self.where}: traceforge is not installed on the cluster's nodes: pip install "
                                f"'traceforge[ray]=={__version__}' on each") from None
            if isinstance(cause, BaseException):
                raise cause from None
            raise UserError(self._lost(" ".join(str(exc).split())[:300])) from None
        except exceptions.RayError as exc:  # a worker or a node died, an object was lost
            self.lost = isinstance(exc, getattr(exceptions, "RaySystemError", ()))
            first = " ".join(str(exc).split())[:200]
            raise UserError(self._lost(f"{type(exc).__name__}: {first}") + " (or lower --jobs if its machines ran out "
                            "of memory)") from None
        except ConnectionError as exc:  # Ray Client: the connection to the head broke
            self.lost = True
            raise UserError(self._lost(f"the connection broke ({exc})")) from None
