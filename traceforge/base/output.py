"""All-or-nothing output directories: write into a hidden sibling, move it into place at the end.

A run that fails (bad input found late, disk full, Ctrl-C, SIGTERM) leaves no OUT behind and
never a half-written one; a failed --force run keeps the old OUT. The rules (docs/output-contract.md):

- ``--force`` replaces only what traceforge wrote (a trace set holding our manifest.json, a
  report's or an export's artifacts), never the home directory, ``/``, the current directory
  or a parent of it, nor a directory holding an input of the command.
- The final move cannot replace a set another run put there meanwhile: without --force it is a
  no-replace rename (renameat2 RENAME_NOREPLACE, else rename(2), which refuses a non-empty
  target); with --force the old and new sets are swapped in one step (RENAME_EXCHANGE), so no
  instant exists without an OUT.
- Temporary names are short (``.tf-<hash>.partial-<pid>``), so any valid OUT name works, and
  the next run on the same OUT removes what a killed run (kill -9) left, or restores an OUT
  that a kill between the two renames of the fallback path left only under its old name.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import re
import shutil
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path

from traceforge.base.errors import UserError

# The files of a trace set beside <prefix>.<rank>.et (docs/output-contract.md).
COMM_GROUP_FILE = "comm_group.json"
MANIFEST_FILE = "manifest.json"

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
# What a report or an export writes (report.json marks a report; <prefix>.<rank>.json an export,
# rank-<rank>.json a PARAM export).
_REPORT_MARK = "report.json"
_EXPORT_FILE = re.compile(r"^(.+\.|rank-)[0-9]+\.json$", re.ASCII)
_ONE_FILE_EXPORT = re.compile(r"^[^.].*\.(goal|simai\.txt)$", re.ASCII)  # export --format goal|simai
_SHARD_FILE = re.compile(r"^shard-[0-9]+-of-[0-9]+\.json$", re.ASCII)
# What a simulator run leaves in its logging folder (ASTRA-sim's spdlog files, our tee of its
# output, the trace-enabled system input, htsim's output): `simulate --log-dir` replaces only these.
_SIMULATOR_LOG = re.compile(r"^(stdout\.txt|(log|err)(\.[0-9]+)?\.log|astra_system\.trace\.json|htsim\.dat)$", re.ASCII)


# The output folders this process moved into place, and those it removed unfinished, as the user
# named them: what a late signal or a closed stdout has the command line say (cli/__init__.py).
_COMMITTED: list[str] = []
_ROLLED_BACK: list[str] = []


def forget_outputs() -> None:
    """A command starts with no record (the tests run many in one process)."""
    _COMMITTED.clear()
    _ROLLED_BACK.clear()


def committed() -> list[str]:
    """The output folders this process has written whole, in order."""
    return list(_COMMITTED)


def rolled_back() -> list[str]:
    """The output folders this process removed before they were complete, in order."""
    return list(_ROLLED_BACK)


def _within(path: Path, ancestor: Path) -> bool:
    return path == ancestor or ancestor in path.parents


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """rename with flags; False when the system or file system does not support it."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(dst))


def is_traceforge_output(directory: Path) -> bool:
    """True when a directory holds what traceforge writes: a trace set (our manifest, or shards
    of one), a report's artifacts or an export."""
    manifest = directory / MANIFEST_FILE
    if manifest.is_file():
        with open(manifest, "rb") as f:
            head = f.read(4096)
        if re.search(rb'"tool"\s*:\s*"traceforge"', head):
            return True
    names = [p.name for p in directory.iterdir()]
    if any(_SHARD_FILE.match(n) for n in names):
        return True
    if _REPORT_MARK in names and (directory / "traffic_by_dimension.csv").is_file():
        return True
    if len(names) == 1 and _ONE_FILE_EXPORT.match(names[0]):
        return True
    return bool(names) and all(n == COMM_GROUP_FILE or _EXPORT_FILE.match(n) for n in names)


# Every name a traceforge command writes into an output folder: what --force may replace
# (check_output_dir), the one rule for every command. tests/suites/test_hostile_output.py writes
# each command's output (a set with each ASTRA-sim bundle, shards, a report, each export, a plan's
# top sets) and holds it to these names. Rank files are `<prefix>.<rank>.et` for the prefix a
# manifest of ours in the folder names.
_OUR_FILE = re.compile(r"""^(
    manifest\.json | comm_group\.json | simulation\.json | spec\.json | shard\.json
  | (plan-)?shard-[0-9]+-of-[0-9]+\.json
  | astra_[a-z0-9_]+\.(json|yml|txt|topo) | run_astra_sim\.sh
  | report\.json | traffic_by_dimension\.csv | traffic_per_rank\.csv | links\.csv | matrix_(nodes|ranks)\.csv
  | test_matrix\.(csv|json) | timeline(_simulated)?\.json | traffic_heatmap\.png
  | (plan|sweep)\.(csv|json|png|svg)
  | [^.].*\.[0-9]+\.json | rank-[0-9]+\.json | [^.].*\.goal | [^.].*\.simai\.txt
)$""", re.X | re.ASCII)
# Folders of ours inside an output folder: the bundle's run script's logs and ns-3's output, and
# a plan's top sets (plan_output.write.folder_name), each an output folder itself.
_LOG_FOLDERS = ("astra_log", "astra_ns3_output")
_NS3_OUTPUT = re.compile(r"^(mix\.tr|fct\.txt|pfc\.txt|qlen\.txt)$", re.ASCII)
_PLAN_FOLDER = re.compile(r"^[0-9]{2,}-t[0-9]+-c[0-9]+-p[0-9]+-d[0-9]+-e[0-9]+-v[0-9]+-b[0-9]+-[a-z0-9-]+$", re.ASCII)
_RANK_FILE = re.compile(r"^(?P<prefix>.+)\.[0-9]+\.et$", re.ASCII)


def _prefixes(directory: Path, names: Iterable[str]) -> set[str]:
    """The trace-file prefixes that manifests of ours in a folder name."""
    found: set[str] = set()
    for name in names:
        if name == MANIFEST_FILE or _SHARD_FILE.match(name):
            try:
                with open(directory / name, "rb") as f:
                    head = f.read(1 << 16)
            except OSError:
                continue
            if re.search(rb'"tool"\s*:\s*"traceforge"', head):
                found.update(m.decode("utf-8", "replace") for m in re.findall(rb'"prefix"\s*:\s*"([^"\\]+)"', head))
    return found


def foreign_entries(directory: Path, _depth: int = 0) -> list[str]:
    """The entries of an output folder that no traceforge command writes (a user's notes put
    beside a set), as paths relative to it: what --force must never remove."""
    if is_simulator_log(directory):  # `simulate --log-dir`'s folder: the simulator's files alone
        return []
    entries = sorted(directory.iterdir())
    names = [p.name for p in entries]
    prefixes = _prefixes(directory, names)
    foreign: list[str] = []
    for path in entries:
        name = path.name
        if path.is_symlink():
            foreign.append(name)
        elif path.is_dir():
            if name in _LOG_FOLDERS and _depth < 2:
                foreign += [f"{name}/{p.name}" for p in sorted(path.iterdir())
                            if not (p.is_file() and (_SIMULATOR_LOG.match(p.name) or _NS3_OUTPUT.match(p.name)))]
            elif _PLAN_FOLDER.match(name) and _depth == 0:
                foreign += [f"{name}/{n}" for n in foreign_entries(path, _depth + 1)]
            else:
                foreign.append(name + "/")
        elif not path.is_file():
            foreign.append(name)
        else:
            rank = _RANK_FILE.match(name)
            if not (_OUR_FILE.match(name) or (rank and rank["prefix"] in prefixes)):
                foreign.append(name)
    return foreign


def is_simulator_log(directory: Path) -> bool:
    """True when a directory holds only what a simulator run writes into its logging folder."""
    names = [p.name for p in directory.iterdir()]
    return bool(names) and all(_SIMULATOR_LOG.match(n) and (directory / n).is_file() for n in names)


def _protected(target: Path) -> str | None:
    cwd = Path.cwd().resolve()
    home = Path.home().resolve()
    if target == Path(target.anchor):
        return "the file system root"
    if _within(home, target):
        return "the home directory" if target == home else "a parent of the home directory"
    if _within(cwd, target):
        return "the current directory" if target == cwd else "a parent of the current directory"
    return None


def _stale_pattern(target: Path) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(_temp_stem(target))}\.(?P<kind>partial|old)-(?P<pid>[0-9]+)$")


def check_output_dir(out: Path, force: bool, inputs: Iterable[Path] = (),
                     replaces: Callable[[Path], bool] = is_traceforge_output) -> Path:
    """Refuse an OUT we must not write or replace; return the real directory to write (a
    symlink to a directory is written through). First, whatever the answer, what a killed run
    left beside OUT is cleaned up: its partial output goes, an old set comes back."""
    out = Path(out)
    target = out.resolve()
    with contextlib.suppress(OSError):  # a parent we cannot list is refused below, or by the write
        remove_stale(target.parent, _stale_pattern(target), target)
    if out.exists() and not out.is_dir():
        raise UserError(f"output path {out} exists and is not a directory: choose another -o/--out")
    why = _protected(target)
    if why:
        raise UserError(f"output directory {out} is {why}: choose a new directory for -o/--out")
    for source in inputs:
        if _within(Path(source).resolve(), target):
            raise UserError(f"output directory {out} would replace the input {source}: choose another -o/--out")
    _check_writable(out, target)
    if target.is_dir() and any(target.iterdir()):
        if not force:
            raise UserError(f"output directory {out} is not empty: choose another -o/--out, or pass --force to replace it")
        # One rule for every command: --force replaces only what traceforge wrote; a file of the
        # user's inside it (notes beside a set) refuses the run, named, and stays where it is.
        foreign = foreign_entries(target)
        if foreign:
            more = f" (and {len(foreign) - 1:,} more)" if len(foreign) > 1 else ""
            raise UserError(f"output directory {out} holds {foreign[0]}{more}, which traceforge did not write; --force "
                            "replaces only traceforge's own files: move it out, or choose another -o/--out")
        if not replaces(target):
            raise UserError(f"output directory {out} holds files traceforge did not write; --force only replaces a "
                            "trace set, report or export of ours: choose another -o/--out")
    return target


def _temp_stem(target: Path) -> str:
    return ".tf-" + hashlib.sha1(target.name.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(directory: Path, pattern: re.Pattern[str], restore: Path | None = None) -> None:
    """Remove temporary entries (named by ``pattern``, whose group 'pid' is the writer) whose
    writer is gone; an 'old' entry is moved back to ``restore`` when that is missing."""
    if not directory.is_dir():
        return
    for entry in sorted(directory.iterdir()):
        match = pattern.match(entry.name)
        if not match or pid_alive(int(match["pid"])):
            continue
        if restore is not None and match["kind"] == "old" and not restore.exists():
            entry.rename(restore)  # a kill between the two renames of a --force run
        else:
            shutil.rmtree(entry, ignore_errors=True)


def _check_writable(out: Path, target: Path) -> None:
    """Refuse, before any work, an OUT whose folder this user cannot write in, or that lies on a
    file system with no storage (/proc, /sys: 'has 0.00 GB free' would miss the point)."""
    parent = next((p for p in target.parents if p.exists()), None)
    if parent is None or not parent.is_dir():
        return  # the write itself says what is wrong
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"output directory {out}: this user may not write in {parent}: choose another -o/--out, "
                        "or change its permissions")
    with contextlib.suppress(OSError):
        if os.statvfs(parent).f_blocks == 0:
            raise UserError(f"output directory {out}: {parent} is on a file system without storage (such as /proc or "
                            "/sys): choose another -o/--out")


def _as_out(exc: OSError, tmp: Path, out: Path) -> None:
    """An error inside the hidden directory names the path the user gave: OUT/workload.3.et, not
    .tf-….partial-…/workload.3.et."""
    for attr in ("filename", "filename2"):
        name = getattr(exc, attr, None)
        if isinstance(name, str) and (name == str(tmp) or name.startswith(str(tmp) + os.sep)):
            setattr(exc, attr, str(out) + name[len(str(tmp)):])


def _commit(tmp: Path, target: Path, force: bool, out: Path, trash: Path) -> None:
    if force and target.exists():
        if _renameat2(tmp, target, _RENAME_EXCHANGE):
            shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old set
            return
        target.rename(trash)  # fallback: a kill here is repaired by the next run (remove_stale)
        tmp.rename(target)
        shutil.rmtree(trash, ignore_errors=True)
        return
    try:
        if target.is_dir() and not any(target.iterdir()):
            target.rmdir()  # an empty OUT may be replaced; a filled one never
        if not _renameat2(tmp, target, _RENAME_NOREPLACE):
            tmp.rename(target)  # rename(2) refuses a non-empty directory
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise UserError(f"output directory {out} was written by another run meanwhile; nothing was replaced: "
                            "choose another -o/--out") from None
        raise


@contextlib.contextmanager
def atomic_output_dir(out: Path, force: bool, inputs: Iterable[Path] = (), need_bytes: int = 0,
                      replaces: Callable[[Path], bool] = is_traceforge_output) -> Iterator[Path]:
    """Yield a hidden directory to write; move it to OUT when the block completes. ``replaces``
    recognizes what --force may replace (by default any output of ours)."""
    out = Path(out)
    target = check_output_dir(out, force, inputs, replaces)
    stem = _temp_stem(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if need_bytes:
        free = shutil.disk_usage(target.parent).free
        if need_bytes > free:
            raise UserError(f"the output would take about {need_bytes / 1e9:,.2f} GB but {target.parent} has "
                            f"{free / 1e9:,.2f} GB free: free space, or choose another -o/--out")
    tmp = target.parent / f"{stem}.partial-{os.getpid()}"
    trash = target.parent / f"{stem}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
    except OSError as exc:
        _as_out(exc, tmp, out)
        raise
    try:
        yield tmp
        _commit(tmp, target, force, out, trash)
        _COMMITTED.append(str(out))
    except BaseException as exc:
        _ROLLED_BACK.append(str(out))
        shutil.rmtree(tmp, ignore_errors=True)
        if trash.exists() and not target.exists():
            trash.rename(target)  # a failed --force run keeps the old OUT
        if isinstance(exc, OSError):
            _as_out(exc, tmp, out)
        raise



_PREFIX = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}$", re.ASCII)


def check_prefix(prefix: str) -> None:
    """A trace-file prefix is a plain name every tool (ours, ASTRA-sim's, a shell) reads back:
    letters, digits, _ . + -, so `<prefix>.<rank>.et` can only land inside OUT."""
    if not _PREFIX.match(prefix):
        raise UserError(f"--prefix {prefix!r} must be 1-200 letters, digits, '_', '.', '+' or '-' "
                        "(not starting with '.', '+' or '-')")


def check_output_file(path: Path, is_ours: Callable[[Path], bool], inputs: Iterable[Path] = (),
                      own_names: Iterable[str] = (), flag: str = "-o/--out") -> Path:
    """Refuse a file we must not write: anything but a regular file, a file traceforge did not
    write (``is_ours`` recognizes one of this command's own), and inside an input directory any
    name but the command's own (``own_names``): a set's rank files and manifest stay as they are."""
    path = Path(path)
    real = path.resolve()
    if (path.exists() or path.is_symlink()) and not path.is_file():
        raise UserError(f"{flag} {path} exists and is not a regular file: choose another path")
    if not real.parent.is_dir():
        raise UserError(f"{flag} {path}: no such directory {path.parent}; create it or choose another path")
    for source in inputs:
        source = Path(source).resolve()
        if _within(real, source) and not (real.parent == source and real.name in set(own_names)):
            raise UserError(f"{flag} {path} is inside the input {source}, which it would change: write it elsewhere"
                            + (f" or as {source / next(iter(own_names))}" if own_names else ""))
    if real.exists():
        try:
            ours = is_ours(real)
        except OSError:
            ours = False
        if not ours:
            raise UserError(f"{flag} {path} exists and traceforge did not write it: choose another path")
    return real


def write_output_file(path: Path, text: str, is_ours: Callable[[Path], bool], inputs: Iterable[Path] = (),
                      own_names: Iterable[str] = (), flag: str = "-o/--out") -> Path:
    """Write one output file all or nothing (a hidden sibling, renamed over it at the end),
    after check_output_file."""
    real = check_output_file(path, is_ours, inputs, own_names, flag)
    stem = _temp_stem(real)
    remove_stale(real.parent, re.compile(rf"^{re.escape(stem)}\.(?P<kind>partial)-(?P<pid>[0-9]+)$"))
    tmp = real.parent / f"{stem}.partial-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return real


def check_shard_dir(out: Path, force: bool, rank_files: Iterable[str], listed: Collection[str],
                    other_spec: str | None) -> Path:
    """The output rule for `generate --shard K/N -o OUT`. Shards share OUT, so it may hold other
    shards' files, but it is never home, `/`, cwd or a parent of one; a rank file this shard writes
    replaces only one a manifest of ours in OUT lists (``listed``), and only with --force; and
    shards of two specs never mix: ``other_spec`` names a manifest in OUT written with another
    spec, which refuses the shard with or without --force."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"output path {out} exists and is not a directory: choose another -o/--out")
    target = out.resolve()
    why = _protected(target)
    if why:
        raise UserError(f"output directory {out} is {why}: choose a new directory for -o/--out")
    if other_spec is not None:
        raise UserError(f"{other_spec} was written with another spec or prefix; shards of two specs never share "
                        "a folder: choose another -o/--out, or remove that set first")
    if not target.is_dir():
        return target
    for name in rank_files:
        path = target / name
        if not (path.exists() or path.is_symlink()):
            continue
        if not path.is_file() or name not in listed:
            raise UserError(f"{path} exists and traceforge did not write it; a shard never replaces another tool's "
                            "files: choose another -o/--out")
        if not force:
            raise UserError(f"{path} exists: this shard was written already; pass --force to write it again")
    return target
