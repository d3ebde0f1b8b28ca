"""Routing imbalance: how many token copies each EP rank sends to each EP rank's experts.

--moe-routing picks the source of one [ep, ep] matrix C per step, micro-batch and MoE layer,
C[src, dst] = token copies EP rank src dispatches to the experts EP rank dst holds:
- ``balanced``: every rank sends T*k/ep copies to every rank (the AllToAll collective);
- ``zipf:S``: expert popularity follows Zipf's law with exponent S (expert of popularity rank
  i drawn with probability proportional to 1/i^S), the ranking shuffled per layer and
  micro-batch; each rank's T*k copies are drawn from it (a multinomial, so rows sum to T*k);
  numpy's PCG64 seeded with (--seed, step, micro-batch, MoE layer): deterministic;
- ``trace:FILE``: counts read from a .npy or .json array of shape [m, L_moe, ep, ep] (the same
  for every step) or [steps, m, L_moe, ep, ep], L_moe the model's MoE layers in layer order.
Every EP group of the world routes alike (one matrix per layer and micro-batch).
See docs/moe-and-imbalance.md.
"""

from __future__ import annotations

import io
from functools import lru_cache
from pathlib import Path

import numpy as np

from traceforge.base.errors import SpecError
from traceforge.base.files import MAX_JSON_FILE_BYTES, read_json, read_regular_file

BALANCED = "balanced"


def parse_routing(text: str) -> tuple[str, float | str | None]:
    """('balanced', None) | ('zipf', S) | ('trace', path); one-line errors otherwise."""
    value = text.strip()
    if value.lower() == BALANCED:
        return BALANCED, None
    kind, _, arg = value.partition(":")
    kind = kind.lower()
    if kind == "zipf":
        try:
            s = float(arg)
        except ValueError:
            s = -1.0
        if not (s > 0 and np.isfinite(s)):
            raise SpecError(f"moe_routing {text!r}: zipf needs a positive exponent, e.g. zipf:1.2")
        return "zipf", s
    if kind == "trace" and arg:
        return "trace", arg
    raise SpecError(f"moe_routing {text!r} is not one of balanced, zipf:S, trace:FILE (e.g. zipf:1.2)")


MAX_TOKEN_COUNT = (1 << 53) - 1  # exact as a float and an int64, far past any batch


@lru_cache(maxsize=8)
def _load(path: str) -> np.ndarray:
    p = Path(path)
    fix = "give the path of a .npy or .json token-count array"
    if not p.exists():
        raise SpecError(f"moe_routing trace file {path} does not exist: {fix}")
    if p.suffix.lower() not in (".npy", ".json"):
        raise SpecError(f"moe_routing trace file {path}: unknown extension {p.suffix!r}; use .npy or .json")
    try:  # through the one bounded reader: a regular file, bounded in size and nesting
        if p.suffix.lower() == ".npy":
            data = read_regular_file(p, "moe_routing trace file", MAX_JSON_FILE_BYTES, fix, SpecError)
            raw = np.load(io.BytesIO(data), allow_pickle=False)
        else:
            raw = np.asarray(read_json(p, "moe_routing trace file", fix, MAX_JSON_FILE_BYTES, SpecError))
    except SpecError:
        raise
    except Exception as exc:  # numpy's and json's error types differ; all mean malformed input
        detail = " ".join(str(exc).split())
        raise SpecError(f"moe_routing trace file {path} is not a readable .npy/.json array: {detail}") from None
    floats_whole = raw.dtype.kind == "f" and bool(np.all(np.isfinite(raw) & (raw == np.round(raw))))
    whole = raw.dtype.kind in "iu" or floats_whole
    if not whole:
        raise SpecError(f"moe_routing trace file {path}: counts must be whole numbers of tokens")
    # Range before the int64 cast: 1e300 or a uint64 of 2^63 would wrap (to a "negative" count).
    bad = (raw < 0) | (raw > MAX_TOKEN_COUNT)
    if raw.size and bool(np.any(bad)):
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        value = raw[where].item()
        what = f"negative token count {value:.6g}" if value < 0 else f"token count {value:.6g}"
        raise SpecError(f"moe_routing trace file {path}: {what} at index {list(where)}; counts must be whole "
                        f"numbers of tokens in 0..{MAX_TOKEN_COUNT:,} (2^53 - 1)")
    return raw.astype(np.int64)


def load_routing_trace(path: str, steps: int, m: int, moe_layers: int, ep: int) -> np.ndarray:
    """The counts as [steps, m, L_moe, ep, ep], checked against the spec's shape."""
    counts = _load(str(Path(path).resolve()))
    shape = (m, moe_layers, ep, ep)
    if counts.shape == shape:
        return np.broadcast_to(counts, (steps, *shape))
    if counts.shape == (steps, *shape):
        return counts
    raise SpecError(f"moe_routing trace file {path} has shape {list(counts.shape)}; this spec needs {list(shape)} "
                    f"(micro-batches, MoE layers, ep, ep) or {[steps, *shape]} with steps first")


def zipf_counts(experts: int, ep: int, copies: int, exponent: float, seed: int, step: int, mb: int,
                moe_layer: int) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64([seed, step, mb, moe_layer]))
    weights = 1.0 / np.arange(1, experts + 1) ** exponent
    probs = (weights / weights.sum())[rng.permutation(experts)]
    per_expert = rng.multinomial(copies, probs, size=ep)  # (src ep rank, expert)
    return per_expert.reshape(ep, ep, experts // ep).sum(axis=2)  # experts are dealt to EP ranks in blocks


class Routing:
    """The count matrices of one spec; ``counts(step, mb, moe_layer)`` is [ep, ep]."""

    def __init__(self, text: str, seed: int, experts: int, ep: int, copies: int, steps: int, m: int, moe_layers: int):
        self.kind, self.arg = parse_routing(text)
        self.seed, self.experts, self.ep, self.copies = seed, experts, ep, copies
        self.table = load_routing_trace(str(self.arg), steps, m, moe_layers, ep) if self.kind == "trace" else None

    @property
    def balanced(self) -> bool:
        return self.kind == BALANCED

    def counts(self, step: int, mb: int, moe_layer: int) -> np.ndarray:
        if self.table is not None:
            return self.table[step, mb, moe_layer]
        if self.kind == "zipf":
            assert isinstance(self.arg, float)
            return zipf_counts(self.experts, self.ep, self.copies, self.arg, self.seed, step, mb, moe_layer)
        return np.full((self.ep, self.ep), self.copies // self.ep, dtype=np.int64)
