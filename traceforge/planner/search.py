"""The search: every candidate through the validator and the memory model, then the feasible
ones replayed in increasing lower-bound order until the bound passes the K-th best step.

Branch and bound keeps the top K exact: a candidate whose lower bound is at least the K-th
best replayed step cannot enter the top K, and neither can any after it (they are sorted by
bound). ``--all`` replays every feasible candidate instead.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from traceforge.errors import SpecError, UserError
from traceforge.memory.report import DOES_NOT_FIT, Band
from traceforge.parallel import fan_out
from traceforge.planner.bound import replay_nodes_floor, step_lower_bound
from traceforge.planner.estimate import Estimate, estimate, model_flops_per_step
from traceforge.planner.memory import memory_band
from traceforge.planner.space import LEVELS, Model, _layouts, walk
from traceforge.read.progress import Progress
from traceforge.report.timing_replay import REPLAY_NODE_LIMIT, LinkModel, ReplayTooBig
from traceforge.spec import Spec, spec_builder


@dataclass(frozen=True)
class Base:
    """What every candidate shares: the preset, spec file and flags the user gave."""

    preset: str | None
    config: Mapping[str, Any] | None
    overrides: Mapping[str, Any]
    config_path: str | None = None  # the spec file's path, for the flags that reproduce a candidate

    def builder(self) -> Callable[..., Spec]:
        return spec_builder(self.preset, self.config, self.overrides)


@dataclass
class Ranked:
    """One replayed candidate."""

    values: dict[str, Any]  # the spec values the search chose
    spec: Spec
    memory: Band  # peak, allocated, reserved bytes and verdict ("fits" or "tight")
    bound_us: float
    estimate: Estimate

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak

    @property
    def step_ms(self) -> float:
        return self.estimate.step_us / 1e3

    @property
    def tflops_per_gpu(self) -> float:
        return model_flops_per_step(self.spec) / (self.spec.world_size * self.estimate.step_us * 1e-6) / 1e12

    @property
    def mfu(self) -> float:
        return self.tflops_per_gpu / self.spec.gpu_tflops

    @property
    def tokens_per_s(self) -> float:
        return self.spec.global_batch * self.spec.seq_len / (self.estimate.step_us * 1e-6)


@dataclass
class PlanResult:
    gpus: int
    considered: int = 0
    legal: int = 0
    feasible: int = 0
    seconds: float = 0.0
    replayed: int = 0
    too_big: int = 0  # feasible candidates beyond the replay's node limit that could have ranked
    # With a replay budget: feasible candidates the budget left unreplayed that could still have
    # ranked (their bound below the K-th best step), and the lowest of their bounds: no layout of
    # the space is faster than min(floor_us, the best step found).
    unreplayed: int = 0
    floor_us: float | None = None
    candidates: list[Ranked] = field(default_factory=list)
    smallest_peak: int | None = None  # the least memory any legal candidate needs
    gpu_memory_bytes: int = 0


class Candidate(NamedTuple):
    """A feasible candidate waiting to be replayed (ordered by bound, then by its values)."""

    bound: float  # microseconds its replay cannot beat
    key: tuple  # sort_key(values)
    values: dict[str, Any]
    memory: Band  # its fullest GPU's peak, allocated, reserved and verdict
    nodes: int  # fewest nodes its replay takes (bound.replay_nodes_floor): what a replay costs


def sort_key(values: Mapping[str, Any]) -> tuple:
    """A total, deterministic order among candidates of equal time (layout fields, then flags)."""
    return tuple((k, str(values.get(k))) for k in sorted(values))


# -- phase 1: validate and filter, per layout (in worker processes) -------------------------

@dataclass
class _Job:
    builder: Callable[..., Spec]
    model: Model
    fixed: Mapping[str, Any]
    link: LinkModel
    gpu_memory: int | None
    overhead_bytes: int | None = None
    reserve: float | None = None


_job: _Job | None = None


def _check(values: dict[str, Any], reads: set[str] | None) -> Spec | None:
    assert _job is not None
    try:
        return _job.builder(values, reads)
    except SpecError:
        return None


@dataclass
class _Share:
    considered: int = 0
    legal: int = 0
    feasible: list[Candidate] = field(default_factory=list)
    too_big: list[float] = field(default_factory=list)  # bounds of feasible candidates past the replay's node limit
    smallest_peak: int | None = None


def _filter_layout(layout: dict[str, Any]) -> _Share:
    """Validate, size and bound every candidate under one layout."""
    assert _job is not None
    share = _Share()
    for values, spec, count in walk(_job.model, _job.fixed, _check, layout, 1):
        share.considered += count
        if spec is None:
            continue
        share.legal += 1
        memory = memory_band(spec, _job.gpu_memory, _job.overhead_bytes, _job.reserve)
        if memory.verdict == DOES_NOT_FIT:  # "tight" stays, flagged: it fits all but the allocator's reserve
            peak = memory.peak
            share.smallest_peak = peak if share.smallest_peak is None else min(share.smallest_peak, peak)
            continue
        bound, nodes = step_lower_bound(spec, _job.link), replay_nodes_floor(spec, _job.link)
        if nodes > REPLAY_NODE_LIMIT:
            share.too_big.append(bound)  # set aside before its programs are built (a minute or more each)
            continue
        share.feasible.append(Candidate(bound, sort_key(values), values, memory, nodes))
    return share


def layouts(model: Model, fixed: Mapping[str, Any], shard: tuple[int, int] | None) -> list[dict[str, Any]]:
    """The search's top level (tp, cp, pp, dp, ep), this shard's share of it (every N-th)."""
    top = _layouts(model, fixed, {})
    assert LEVELS[0][0] is _layouts
    return top if shard is None else top[shard[0]::shard[1]]


def search(base: Base, model: Model, fixed: Mapping[str, Any], link: LinkModel, gpu_memory: int | None,
           top: int, every: bool = False, jobs: int = 1, shard: tuple[int, int] | None = None,
           quiet: bool = False, until_us: float | None = None, budget_s: float | None = None,
           overhead_bytes: int | None = None, reserve: float | None = None) -> PlanResult:
    """until_us: also replay every candidate whose bound is below it (and keep them all), so the
    rank of a layout of that step among all candidates is exact (the published-run check).
    budget_s: stop replaying once the search has run this many seconds, validating and sizing
    included (and one candidate is ranked); the result then says how many could still have
    ranked and the lowest step they could reach."""
    global _job
    started = time.perf_counter()
    builder = base.builder()
    _job = _Job(builder, model, fixed, link, gpu_memory, overhead_bytes, reserve)
    result = PlanResult(model.world, gpu_memory_bytes=gpu_memory or 0)
    tops = layouts(model, fixed, shard)
    progress = Progress(f"plan {model.world:,} GPUs: layouts", len(tops)) if not quiet else None
    feasible: list[Candidate] = []
    too_big: list[float] = []
    shares: Iterator[_Share] = (fan_out(_filter_layout, tops, jobs) if jobs > 1 and len(tops) > 1
                                else map(_filter_layout, tops))
    for share in shares:
        result.considered += share.considered
        result.legal += share.legal
        feasible += share.feasible
        too_big += share.too_big
        if share.smallest_peak is not None:
            result.smallest_peak = share.smallest_peak if result.smallest_peak is None else min(result.smallest_peak, share.smallest_peak)
        if progress:
            progress.advance()
    if progress:
        progress.close()
    result.feasible = len(feasible) + len(too_big)
    feasible.sort(key=lambda c: (c[0], c[1]))
    deadline = None if budget_s is None else started + budget_s
    result.candidates, result.replayed, too_big_replayed, left = _branch_and_bound(
        builder, feasible, link, top, every, quiet, until_us, jobs, deadline, budget_s)
    # What could still have entered the top K: a bound at most the K-th best step.
    kth = result.candidates[min(top, len(result.candidates)) - 1].estimate.step_us if result.candidates else 0.0
    limit = float("inf") if every or len(result.candidates) < top else max(kth, until_us or 0.0)
    result.too_big = too_big_replayed + sum(1 for bound in too_big if bound <= limit)
    could_rank = [c.bound for c in left if c.bound <= limit]
    result.unreplayed = len(could_rank)
    result.floor_us = min(could_rank) if could_rank else None
    result.seconds = time.perf_counter() - started
    return result


# -- phase 2: replay in bound order ---------------------------------------------------------

# Seconds one node of a candidate's replay floor costs to build and replay, until replays of this
# search have measured it (about 11 µs per floor node for the 405B candidates on the 2-core
# machine the planner was written on; kept above that, to err on passing over a replay): with a
# budget, a replay that cannot end before the deadline is not started.
DEFAULT_SECONDS_PER_NODE = 20e-6
# A replay's cost is its floor at the mean seconds per node so far; one candidate's own rate
# varies around that mean (its floor is 70-95 % of its nodes; a ring's transfers cost more than
# compute), so a replay is started only if it would end in time at this multiple of its cost.
COST_MARGIN = 1.5


def _replay(item: Candidate) -> tuple[Estimate | None, float]:
    """One candidate's estimate (None past the replay's node limit) and the seconds it took
    (in a worker process)."""
    assert _job is not None
    started = time.perf_counter()
    try:
        est: Estimate | None = estimate(_job.builder(item.values), _job.link)
    except ReplayTooBig:  # millions of nodes: not ranked, counted
        est = None
    return est, time.perf_counter() - started


def _branch_and_bound(builder: Callable[..., Spec], feasible: list[Candidate], link: LinkModel, top: int,
                      every: bool, quiet: bool, until_us: float | None = None, jobs: int = 1,
                      deadline: float | None = None, budget_s: float | None = None,
                      ) -> tuple[list[Ranked], int, int, list[Candidate]]:
    """(ranked, replayed, too big, candidates a deadline left unreplayed).

    With a deadline (perf_counter seconds; budget_s: the whole budget) no replay is started
    past it once one candidate is ranked, and none whose cost (its node floor at the seconds
    per node measured so far, times COST_MARGIN) would end past it: those are left for the
    certificate (their bounds), in favour of the next ones in bound order that can still end.
    If none can (the validation used the budget up), the candidates that cost at most the whole
    budget are replayed in bound order until one is ranked, or else the cheapest."""
    best: list[float] = []  # the K best steps so far, as a max-heap of -step
    ranked: list[Ranked] = []
    too_big = 0
    stops_in = None if deadline is None else deadline - time.perf_counter()  # the counter's time left ends with the budget
    progress = Progress("plan: replaying candidates", len(feasible), stops_in_s=stops_in) if not quiet else None
    sent: deque[Candidate] = deque()
    left: list[Candidate] = []
    rate = [0.0, 0]  # seconds and floor nodes of the replays done

    def seconds_per_node() -> float:
        return rate[0] / rate[1] if rate[1] else DEFAULT_SECONDS_PER_NODE

    def in_bound_order() -> Iterator[Candidate]:
        # Workers take candidates ahead of the results; each is checked against the K-th best
        # step known when it is taken, so a few more than needed may be replayed, never fewer.
        sent_any = False
        for index, item in enumerate(feasible):
            if not every and len(best) >= top and item.bound > max(-best[0], until_us or 0.0):
                return  # strictly: a candidate whose step ties the K-th may still rank before it
            if deadline is not None:
                now = time.perf_counter()
                if ranked and now > deadline:
                    left.extend(feasible[index:])  # out of time: reported by their lowest bound
                    return
                if now + COST_MARGIN * item.nodes * seconds_per_node() > deadline:
                    left.append(item)
                    continue
            sent_any = True
            sent.append(item)
            yield item
        if deadline is not None and not sent_any and left:  # none could end in time: rank one anyway
            per_node = seconds_per_node()
            affordable = [c for c in left if c.nodes * per_node <= (budget_s or 0.0)]
            for item in affordable or sorted(left, key=lambda c: (c.nodes, c.bound, c.key)):
                if ranked:
                    break
                left.remove(item)
                sent.append(item)
                yield item

    results = fan_out(_replay, in_bound_order(), jobs) if jobs > 1 else map(_replay, in_bound_order())
    for est, seconds in results:
        item = sent.popleft()
        rate[0] += seconds
        rate[1] += item.nodes
        if progress:
            progress.advance()
        if est is None:
            too_big += 1
            continue
        if est.stalled:
            raise UserError(f"the replay of a legal candidate stalled ({est.stalled} nodes never ran): "
                            "please report this spec: " + ", ".join(f"{k}={v}" for k, v in item.values.items()))
        ranked.append(Ranked(item.values, builder(item.values), item.memory, item.bound, est))
        if len(best) < top:
            heapq.heappush(best, -est.step_us)
        elif -est.step_us > best[0]:
            heapq.heapreplace(best, -est.step_us)
    if progress:
        progress.close()
    replayed = len(ranked)
    ranked.sort(key=lambda r: (r.estimate.step_us, sort_key(r.values)))
    return (ranked if every or until_us is not None else ranked[:top]), replayed, too_big, left


def check_feasible(result: PlanResult, model: Model) -> None:
    """One line naming the constraint that removed the last candidates, when none is left."""
    if not result.considered:
        raise UserError(f"no layout to consider for {model.world:,} GPUs: the GPU count has no tensor-parallel size "
                        "that divides it within a node; give a multiple of --gpus-per-node or --tp-across-nodes")
    if not result.legal:
        raise UserError(f"none of the {result.considered:,} layouts for {model.world:,} GPUs is legal (each refused by "
                        f"generate's validator): check --global-batch (divisible by micro-batch x dp) and "
                        f"the layers and heads against the GPU count; 'traceforge generate' with one layout names the rule")
    if not result.feasible:
        need = (result.smallest_peak or 0) / 1e9
        raise UserError(f"none of the {result.legal:,} legal layouts fits in GPU memory ({result.gpu_memory_bytes / 1e9:,.1f} GB): "
                        f"the smallest needs {need:,.1f} GB per GPU; use more GPUs, a GPU with more memory "
                        "(--gpu, --gpu-memory-gb) or a smaller --global-batch/--seq-len")
