"""Reading a file a user points us at: only regular files, never more than their size.

A FIFO or a device (/dev/zero) would hang a reader or feed it without end; a symbolic-link
loop is not "missing". Every refusal names the path and what it is instead.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any, NoReturn

from traceforge.base.errors import UserError

# Limits on what one file may hold; beyond them the file is not what it claims to be.
MAX_SPEC_FILE_BYTES = 1 << 20  # a spec is a few dozen flat keys
MAX_JSON_FILE_BYTES = 1 << 30  # comm_group.json / manifest.json of a few million ranks
MAX_RANK_FILE_BYTES = 1 << 31  # one rank's trace (protobuf's own message limit is 2 GiB)


def input_file_problem(path: Path) -> str | None:
    """Why a path cannot be read as a regular file, or None."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        return "is a broken symbolic link" if path.is_symlink() else "does not exist"
    except OSError as exc:  # ELOOP (a symbolic-link loop), EACCES, ENAMETOOLONG, ...
        return f"cannot be opened ({exc.strerror})"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory"
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        return f"is {kind}, not a regular file"
    return None


def read_regular_file(path: Path, what: str, limit: int, fix: str, error: type[UserError] = UserError) -> bytes:
    """A regular file's bytes, at most ``limit``; anything else is ``error`` naming the path."""
    path = Path(path)
    problem = input_file_problem(path)
    if problem:
        raise error(f"{what} {path} {problem}: {fix}")
    size = path.stat().st_size
    if size > limit:
        raise error(f"{what} {path} is {size:,} bytes, more than the {limit:,} it can be: {fix}")
    with open(path, "rb") as f:
        return f.read(limit + 1)


INT64_MAX = (1 << 63) - 1  # simulators count time in signed/unsigned 64-bit ticks


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number JSON allows")


def read_json(path: Path, what: str, fix: str, limit: int = MAX_JSON_FILE_BYTES,
              error: type[UserError] = UserError) -> object:
    """A JSON file through the one bounded reader: a regular file, at most ``limit`` bytes, UTF-8,
    nesting no deeper than Python's parser takes (100,000-deep brackets are one line, not a
    RecursionError), and no NaN or Infinity (not JSON, and no count or time is one)."""
    data = read_regular_file(path, what, limit, fix, error)
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise error(f"{what} {path}: JSON nested too deeply (more levels than any such file has); {fix}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise error(f"{what} {path}: not valid JSON ({' '.join(str(exc).split())[:200]}); {fix}") from None


class Fields:
    """The schema check of a side file's fields: every value a reader uses is checked for its
    type and range here, and a wrong one is one line naming the file and the field."""

    def __init__(self, path: Path | str, fix: str, error: type[UserError] = UserError) -> None:
        self.path, self.fix, self.error = path, fix, error

    def fail(self, where: str, value: object, expected: str) -> NoReturn:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise self.error(f"{self.path}: {where} is {shown}, expected {expected}; {self.fix}")

    def mapping(self, value: object, where: str) -> dict:
        if not isinstance(value, dict):
            self.fail(where, value, "an object")
        return value

    def items(self, value: object, where: str) -> list:
        if not isinstance(value, list):
            self.fail(where, value, "a list")
        return value

    def text(self, value: object, where: str, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            self.fail(where, value, "a string")
        return value

    def whole(self, value: object, where: str, low: int = 0, high: int = INT64_MAX) -> int:
        """An integer (not a bool, not a float) in [low, high]."""
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(where, value, f"a whole number in {low:,}..{high:,}")
        return value

    def number(self, value: object, where: str, low: float = 0.0, high: float = float(INT64_MAX)) -> float:
        """A finite number in [low, high]."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            self.fail(where, value, f"a number in {low:g}..{high:g}")
        return float(value)


def decimal(text: str) -> int | None:
    """text's value when it is a plain decimal number (ASCII digits only), else None: a name read
    from a file ("²" or "٣" pass str.isdigit, and int() refuses the first) is judged by this."""
    return int(text) if text.isascii() and text.isdigit() else None


class _DuplicateKey(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """json object_pairs_hook: a key given twice is an error, not a silent last-wins."""
    out: dict[Any, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} is given twice")
        out[key] = value
    return out


def _yaml_load(text: str, kind: str) -> Any:
    """yaml.safe_load without aliases (a spec or a fabric needs none; an alias bomb would expand without
    end) and without duplicate keys."""
    import yaml

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise _DuplicateKey(f"line {mark.line + 1}: YAML aliases (*name) are not allowed in a {kind}")
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
            keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
            seen: set[Any] = set()
            for key, (knode, _) in zip(keys, node.value, strict=True):
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: let the base class report it
                    continue
                if dup:
                    raise _DuplicateKey(f"line {knode.start_mark.line + 1}: key {key!r} is given twice")
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass


def read_structured(path: Path, what: str, kind: str, fix: str, error: type[UserError] = UserError) -> Any:
    """A YAML, TOML or JSON file (by its extension, which the caller has checked) through the one
    bounded reader, parsed: UTF-8, no YAML aliases, no key given twice; anything else is one line
    of ``error`` naming the path (what: 'config file'; kind: 'spec file', the noun of the alias rule)."""
    path = Path(path)
    suffix = path.suffix.lower()
    data_bytes = read_regular_file(path, what, MAX_SPEC_FILE_BYTES, fix, error)
    try:
        text = data_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not UTF-8 text: save it as a UTF-8 .yaml, .toml or .json file") from None
    try:
        if suffix in (".yaml", ".yml"):
            return _yaml_load(text, kind)
        if suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            return tomllib.loads(text)
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except Exception as exc:  # the parsers' own error types differ; all mean malformed input
        detail = " ".join(str(exc).split())[:300]  # bounded: a message may quote the input
        raise error(f"{what} {path} is not valid {suffix.lstrip('.').upper()}: {detail}") from None
