"""Memoizing a function of a spec on only the fields it reads.

The planner asks the same questions (a stage's model states, its activation peak, one
layer's time floor) of hundreds of thousands of specs that differ only in fields the answer
does not read (a stage's weights do not depend on the micro-batch size), so a memo keyed on
the whole spec never hits. ``ignoring(*names)`` keys on every field but the named ones: a
field added to Spec later is part of every key by default, which is the safe side.
tests/config/test_spec_cache.py checks, for every use, that the named fields are truly not read.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from traceforge.config import Spec

R = TypeVar("R")
FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Spec))


class _Key:
    """A spec's key tuple with its hash computed once (a tuple's is recomputed at every lookup)."""

    __slots__ = ("values", "hash")

    def __init__(self, values: tuple):
        self.values, self.hash = values, hash(values)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and self.hash == other.hash and self.values == other.values


# The spec last keyed and its keys per set of ignored fields: the planner asks many memoized
# questions of one candidate in a row (a stage's parameters for every stage, its states, its
# peak, its bound), and a key reads ~100 fields. A frozen spec's fields never change.
_last: list[Any] = [None, {}]


def _key_of(spec: Spec, names: frozenset[str], getter: Callable[[Spec], tuple]) -> _Key:
    if _last[0] is not spec:
        _last[0], _last[1] = spec, {}
    keys = _last[1]
    key = keys.get(names)
    if key is None:
        key = keys[names] = _Key(getter(spec))
    return key  # type: ignore[no-any-return]


def ignoring(*names: str, maxsize: int = 4096) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Memoize fn(spec, *args) on spec's fields other than names, and on args (hashable);
    least recently used entries go first once maxsize are held."""
    unknown = set(names) - set(FIELD_NAMES)
    if unknown:
        raise ValueError(f"not Spec fields: {sorted(unknown)}")
    key_of = operator.attrgetter(*(n for n in FIELD_NAMES if n not in names))
    ignored = frozenset(names)

    def wrap(fn: Callable[..., R]) -> Callable[..., R]:
        memo: OrderedDict[tuple, Any] = OrderedDict()

        @functools.wraps(fn)
        def call(spec: Spec, *args: Any) -> R:
            key = (_key_of(spec, ignored, key_of), args)
            try:
                memo.move_to_end(key)
                return memo[key]  # type: ignore[no-any-return]
            except KeyError:
                pass
            value = memo[key] = fn(spec, *args)
            if len(memo) > maxsize:
                memo.popitem(last=False)
            return value

        call.ignored = ignored  # type: ignore[attr-defined]
        call.uncached = fn  # type: ignore[attr-defined]
        call.cache_clear = memo.clear  # type: ignore[attr-defined]
        return call

    return wrap


def unchecked_copy(spec: Spec, **values: Any) -> Spec:
    """A shallow copy of spec with these fields set, not validated (dataclasses.replace would read
    and re-check every field): for a spec the caller knows legal, e.g. one that differs only in
    fields a memoized piece ignores, made before anyone else sees it."""
    out = copy.copy(spec)
    for name, value in values.items():
        object.__setattr__(out, name, value)  # the frozen dataclass's own fresh copy
    return out
