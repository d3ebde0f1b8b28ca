"""The search: every candidate through the validator and the memory model, then the feasible
ones replayed in increasing lower-bound order until the bound passes the K-th best step.

Branch and bound keeps the top K exact: a candidate whose lower bound is at least the K-th
best replayed step cannot enter the top K, and neither can any after it (they are sorted by
bound). ``--all`` replays every feasible candidate instead.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from traceforge.base.errors import SpecError, UserError
from traceforge.base.pool import Shared, fan_out
from traceforge.config import LayerRun, Spec, spec_builder
from traceforge.machine.cluster import Cluster
from traceforge.memory.report import DOES_NOT_FIT, Band
from traceforge.model.flops import model_flops_per_step
from traceforge.search.bound import FLOOR_PROBE, layout_floor, replay_nodes_floor, step_lower_bound
from traceforge.search.estimate import Estimate, estimate
from traceforge.search.fits import memory_band
from traceforge.search.progress import SearchProgress
from traceforge.search.ring_floor import ring_layout_floor
from traceforge.search.space import LEVELS, Model, _layouts, _micro_batches, layout_counts, walk
from traceforge.timing.engine import REPLAY_NODE_LIMIT, ReplayTooBig


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
    unsearched: int = 0  # layouts (tp cp pp dp ep) the budget left unvalidated whose floor could still rank
    pruned: int = 0  # layouts never validated: their floor (bound.layout_floor) is above the K-th best step
    floor_us: float | None = None  # the lowest bound of the unreplayed candidates and unsearched layouts
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
    base: Base
    model: Model
    fixed: Mapping[str, Any]
    link: Cluster
    gpu_memory: int | None
    overhead_bytes: int | None = None
    reserve: float | None = None

    def __post_init__(self) -> None:
        self.builder = self.base.builder()

    def __getstate__(self) -> dict[str, Any]:  # to a Ray worker: the builder (and its memos) is rebuilt there
        return {k: v for k, v in self.__dict__.items() if k != "builder"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__post_init__()


_job: _Job | None = None


def _use_job(job: _Job) -> None:
    """Make ``job`` the workers' (pool.Shared: forked workers inherit it, a Ray worker installs it once)."""
    global _job
    _job = job


def _shared() -> Shared:
    assert _job is not None
    return Shared(_use_job, _job)


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
    for values, spec, n in walk(_job.model, _job.fixed, _check, layout, 1):
        share.considered += n
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


def probe_runs(builder: Callable[..., Spec], model: Model, fixed: Mapping[str, Any],
               layout: Mapping[str, Any]) -> list[LayerRun]:
    """The layer's run (what bound.layout_floor reads) at each micro-batch size of a top-level
    layout, at bound.FLOOR_PROBE's values, but for the sizes no candidate of which is legal
    (probes); none when there is no such size, or the validator refuses every size's probe."""
    return probes(builder, model, fixed, layout)[0]


# The keys below a layout and its micro-batch size: a probe refused without reading one of them
# is refused for every candidate of that size, as walk() refuses a whole subtree.
BELOW_MICRO_BATCH = frozenset(key for _, keys in LEVELS[2:] for key in keys)


def probes(builder: Callable[..., Spec], model: Model, fixed: Mapping[str, Any],
           layout: Mapping[str, Any]) -> tuple[list[LayerRun], bool]:
    """(probe_runs, whether the layout has no legal candidate at all: the validator refused
    every size on the layout and the size alone). A size whose probe spec it refuses for a probe
    value (as the per-rank node limit of many micro-batches, which reads the schedule) has no
    spec; its run is a validated size's with the size and the micro-batch count changed: what
    the layer floors read of a run is the layer and its micro-batches, which the refusal did
    not judge."""
    assert LEVELS[1][0] is _micro_batches
    runs, refused = [], []
    for child in _micro_batches(model, fixed, layout):
        values = {**layout, **child, **{k: v for k, v in FLOOR_PROBE.items() if fixed.get(k) is None}}
        reads: set[str] = set()
        try:
            runs.append(builder(values, reads).run)
        except SpecError:
            if reads & BELOW_MICRO_BATCH:  # else no candidate of this size is legal: it has no floor to give
                refused.append(child["micro_batch"])
    if runs:
        first = runs[0]
        runs += [dataclasses.replace(first, micro_batch=mb, num_microbatches=first.global_batch // (layout["dp"] * mb))
                 for mb in refused]
    return runs, not runs and not refused


def _layout_floor(layout: dict[str, Any], record: bool = True) -> tuple[float, bool]:
    """(a floor of a top-level layout, whether it is the recorded one): with record False, a
    layout with a p2p ring gets its ring's floor alone (ring_floor.py: a cost model per micro-batch
    size instead of thousands of recorded ops), the others their recorded floor."""
    assert _job is not None
    runs, empty = probes(_job.builder, _job.model, _job.fixed, layout)
    if empty:
        return EMPTY, True  # no candidate to validate, nor to rank
    ring = ring_layout_floor(runs, layout["pp"])
    if ring > 0 and not record:
        return ring, False
    return max(ring, layout_floor(runs, layout["pp"], _job.link)), True  # both never above a candidate's bound


EMPTY = float("inf")  # the floor of a layout without a legal candidate: never validated once one ranks


def _group_floors(task: tuple[bool, list[dict[str, Any]]]) -> list[tuple[float, bool]]:
    """_layout_floor of layouts that share their layer recordings (one tp, cp and ep), in one
    worker, whose memo then records each layer once for them all."""
    record, group = task
    return [_layout_floor(layout, record) for layout in group]


def _floor_groups(tops: list[dict[str, Any]], which: list[int]) -> list[list[int]]:
    """The layouts `which` (indices into tops) in groups of one (tp, cp, ep), cheapest first: a
    long context-parallel ring records thousands of transfers per layer, so the largest cp last."""
    groups: dict[tuple, list[int]] = {}
    for i in sorted(which, key=lambda i: tops[i]["cp"]):
        groups.setdefault((tops[i]["tp"], tops[i]["cp"], tops[i]["ep"]), []).append(i)
    return list(groups.values())


def search(base: Base, model: Model, fixed: Mapping[str, Any], link: Cluster, gpu_memory: int | None,
           top: int, every: bool = False, jobs: int = 1, shard: tuple[int, int] | None = None,
           quiet: bool = False, until_us: float | None = None, budget_s: float | None = None,
           overhead_bytes: int | None = None, reserve: float | None = None) -> PlanResult:
    """until_us: also replay every candidate whose bound is below it (and keep them all), so the
    rank of a layout of that step among all candidates is exact (the published-run check).
    budget_s: stop once the search has run this many seconds, bounding, validating and sizing
    included (and one candidate is ranked); the result then says how many candidates and
    layouts could still have ranked and the lowest step they could reach."""
    global _job
    started = time.perf_counter()
    _job = _Job(base, model, fixed, link, gpu_memory, overhead_bytes, reserve)
    builder = _job.builder
    result = PlanResult(model.world, gpu_memory_bytes=gpu_memory or 0)
    tops = layouts(model, fixed, shard)
    progress = SearchProgress(model.world, len(tops), quiet, None if budget_s is None else started + budget_s)
    deadline = None if budget_s is None else started + budget_s
    floors: list[float | None] = [None] * len(tops)
    # Every layout gets a floor before anything is validated, so that whenever the budget ends the
    # plan can say how far its best is from the best layout: first the recorded floor of each layout
    # without a ring and the cheap ring floor of each layout with one (ring_floor.py; not bounded by
    # the budget: seconds at 16,384 GPUs), then, within FLOORS_SHARE of a budget, the recorded floors
    # of the ring layouts, smallest cp first, each raising the ring's floor.
    recorded = [False] * len(tops)
    for record in (False, True):
        groups = _floor_groups(tops, [i for i in range(len(tops)) if not recorded[i]])

        def tasks(record: bool = record, groups: list[list[int]] = groups) -> Iterator[tuple[bool, list[dict[str, Any]]]]:
            for group in groups:
                if record and budget_s is not None and time.perf_counter() > started + FLOORS_SHARE * budget_s:
                    return
                yield record, [tops[i] for i in group]

        found = fan_out(_group_floors, tasks(), jobs, shared=_shared())
        for group, answers in zip(groups, found, strict=False):
            for i, (floor, exact) in zip(group, answers, strict=True):
                floors[i], recorded[i] = max(floor, floors[i] or 0.0), exact
                if not record:
                    progress.bounded()
    sizes = {id(layout): n for layout, n in zip(tops, layout_counts(model, fixed, tops), strict=True)}  # candidates per layout
    state = _branch_and_bound(builder, list(zip(floors, tops, strict=True)), sizes, top, every, until_us, jobs,
                              deadline, budget_s, progress)
    progress.close()
    result.considered = sum(sizes.values())
    result.legal, result.smallest_peak = state.legal, state.smallest_peak
    result.feasible = state.feasible + len(state.too_big)
    result.candidates, result.replayed = state.ranked, state.replayed
    # What could still have entered the top K: a bound at most the K-th best step.
    kth = state.kth()
    limit = float("inf") if every or kth is None else max(kth, until_us or 0.0)
    result.too_big = state.too_big_replayed + sum(1 for bound in state.too_big if bound <= limit)
    could_rank = [c.bound for c in state.left if c.bound <= limit]
    unsearched = [f for f, _ in state.left_layouts if f <= limit and f != EMPTY]  # (0: no floor)
    result.unreplayed, result.unsearched = len(could_rank), len(unsearched)
    result.pruned = len(tops) - state.expanded - len(unsearched)
    result.floor_us = min(could_rank + unsearched) if could_rank or unsearched else None
    result.seconds = time.perf_counter() - started
    return result


FLOORS_SHARE = 0.4  # of a budget, at most, for the layouts' floors (a layout without one leaves the answer unknown)


# -- phase 2: replay in bound order ---------------------------------------------------------

# Seconds one node of a candidate's replay floor costs to build and replay, until replays of this
# search have measured it (about 11 µs per floor node for the 405B candidates on the 2-core
# machine the planner was written on; kept above that, to err on passing over a replay): with a
# budget, a replay that cannot end before the deadline is not started.
DEFAULT_SECONDS_PER_NODE = 20e-6
# Only replays of at least this many floor nodes measure the rate: a replay of 2,000 nodes takes
# 0.4 s (100 times the per-node rate of one of 2,000,000), which would pass over every large one.
RATE_MIN_NODES = 50_000
# Seconds validating, sizing and bounding one candidate of a layout costs until this search has
# measured it (an MoE candidate at 256 GPUs about 0.5 ms on the 2-core machine; a dense one less).
DEFAULT_SECONDS_PER_CANDIDATE = 1e-3
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


SKIPPED = "skipped"  # a task a worker took too late to end before the deadline


def _task(task: tuple[str, Any, float | None]) -> tuple[Any, float]:
    """A worker's task: validate, size and bound one layout's candidates, or replay one; unless
    it starts after `start_by` (time.time() seconds: one clock for every process and, within
    NTP's milliseconds, every machine of a Ray cluster): tasks are handed out ahead of the
    answers, so one may be taken after the deadline it was sent for."""
    kind, item, start_by = task
    if start_by is not None and time.time() > start_by:
        return SKIPPED, 0.0
    if kind == "layout":
        started = time.perf_counter()
        return _filter_layout(item[1]), time.perf_counter() - started
    return _replay(item)


@dataclass
class _State:
    """What the branch and bound has learnt so far."""

    top: int
    ranked: list[Ranked] = field(default_factory=list)
    best: list[float] = field(default_factory=list)  # the K best steps so far, as a max-heap of -step
    replayed: int = 0
    too_big_replayed: int = 0
    legal: int = 0
    feasible: int = 0  # candidates of the layouts expanded that fit (within the replay's node limit)
    too_big: list[float] = field(default_factory=list)  # bounds of feasible candidates past the node limit
    smallest_peak: int | None = None
    expanded: int = 0  # layouts validated
    left: list[Candidate] = field(default_factory=list)  # candidates the deadline left unreplayed
    left_layouts: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # layouts it left unvalidated
    replay_rate: list[float] = field(default_factory=lambda: [0.0, 0.0])  # seconds, floor nodes
    validate_rate: list[float] = field(default_factory=lambda: [0.0, 0.0])  # seconds, candidates considered

    def kth(self) -> float | None:
        return -self.best[0] if len(self.best) >= self.top else None

    def seconds_per_node(self) -> float:
        seconds, nodes = self.replay_rate
        return seconds / nodes if nodes else DEFAULT_SECONDS_PER_NODE

    def seconds_per_candidate(self) -> float:
        seconds, n = self.validate_rate
        return seconds / n if n else DEFAULT_SECONDS_PER_CANDIDATE


def _branch_and_bound(builder: Callable[..., Spec], layouts: list[tuple[float | None, dict[str, Any]]],
                      sizes: dict[int, int], top: int, every: bool, until_us: float | None, jobs: int, deadline: float | None,
                      budget_s: float | None, progress: SearchProgress) -> _State:
    """Layouts (with their floors) and candidates in one queue by bound: a layout is validated
    (its candidates join the queue, each at least its layout's floor) when it comes first, a
    candidate replayed; it ends when the next bound is above the K-th best replayed step, so no
    layout whose floor is above it is validated at all.

    With a deadline (perf_counter seconds; budget_s: the whole budget) nothing is started past
    it once one candidate is ranked, and nothing whose cost (a replay: its node floor at the
    seconds per node measured so far; a layout: its candidates at the seconds per candidate
    measured so far; times COST_MARGIN) would end past it: those are left for the certificate
    (their bounds), in favour of the next ones in bound order that can still end. Layouts
    without a floor (the budget stopped the floors) come after the queue. Until one candidate
    fits, every layout is validated; if no replay can end in time, the cheapest is replayed."""
    state = _State(top)
    queue: list[tuple[float, int, tuple, int]] = []  # (bound, 0 layout / 1 candidate, key, id)
    items: dict[int, Any] = {}
    ids = itertools.count()

    def push(bound: float, kind: int, key: tuple, item: Any) -> None:
        i = next(ids)
        items[i] = item
        heapq.heappush(queue, (bound, kind, key, i))

    unbounded: deque[dict[str, Any]] = deque()  # layouts without a floor: after the queue, 0 in the certificate
    for floor, layout in layouts:
        if floor is None:
            unbounded.append(layout)
        else:
            push(floor, 0, sort_key(layout), (floor, layout))
    sent: deque[tuple[str, Any, float | None]] = deque()

    def cost(kind: int, item: Any) -> float:
        if kind == 0:
            return sizes[id(item[1])] * state.seconds_per_candidate()
        return item.nodes * state.seconds_per_node()

    def leave(kind: int, item: Any) -> None:
        (state.left_layouts if kind == 0 else state.left).append(item)

    def in_bound_order() -> Iterator[tuple[str, Any, float | None]]:
        # Workers take tasks ahead of the results; each is checked against the K-th best step
        # known when it is taken, so a few more than needed may be done, never fewer.
        while True:
            if queue and not stop(queue[0][0]):
                _, kind, _, i = heapq.heappop(queue)
                item = items.pop(i)
            elif unbounded and not out_of_time():
                kind, item = 0, (0.0, unbounded.popleft())
            else:
                return  # pruned by the K-th best, or out of time: what is queued is reported by its bound
            start_by = None
            # until a layout has given a candidate, layouts are validated whatever the time
            if deadline is not None and (kind == 1 or state.feasible):
                start_by = deadline - COST_MARGIN * cost(kind, item)
                if time.perf_counter() > start_by:
                    leave(kind, item)
                    continue
            task = ("layout" if kind == 0 else "replay", item,
                    None if start_by is None else time.time() + start_by - time.perf_counter())  # (see _task)
            sent.append(task)
            yield task

    def stop(bound: float) -> bool:
        kth = state.kth()
        if not every and kth is not None and bound > max(kth, until_us or 0.0):
            return True  # strictly: a candidate whose step ties the K-th may still rank before it
        return out_of_time()

    def out_of_time() -> bool:
        return deadline is not None and bool(state.ranked) and time.perf_counter() > deadline

    while True:
        tasks = in_bound_order()
        results = fan_out(_task, tasks, jobs, shared=_shared())
        for answer, seconds in results:
            name, item, _ = sent.popleft()
            if isinstance(answer, str) and answer == SKIPPED:  # (a copy, from a worker process)
                leave(0 if name == "layout" else 1, item)
            elif name == "layout":
                floor, _ = item
                _take_share(state, answer, seconds)
                for c in answer.feasible:  # each at least its layout's floor (equal but for rounding)
                    push(max(c.bound, floor), 1, c.key, c._replace(bound=max(c.bound, floor)))
            else:
                _take_replay(state, builder, item, answer, seconds)
            progress.update(state, len(queue))
        if not state.ranked and not queue and not unbounded and state.left:
            # none could end in time: the cheapest candidate is replayed anyway, so a plan ranks one
            first = min(state.left, key=lambda c: (c.nodes, c.bound, c.key))
            state.left.remove(first)
            push(first.bound, 1, first.key, first)
            deadline = None
            continue
        if (not queue or stop(queue[0][0])) and (not unbounded or out_of_time()):
            break  # else validated layouts added candidates after the tasks ran out: another round
    for entry in queue:
        leave(entry[1], items[entry[3]])
    state.left_layouts += [(0.0, layout) for layout in unbounded]
    state.ranked.sort(key=lambda r: (r.estimate.step_us, sort_key(r.values)))
    if not (every or until_us is not None):
        state.ranked = state.ranked[:top]
    return state


def _take_share(state: _State, share: _Share, seconds: float) -> None:
    state.expanded += 1
    state.legal += share.legal
    state.feasible += len(share.feasible)
    state.too_big += share.too_big
    state.validate_rate[0] += seconds
    state.validate_rate[1] += share.considered
    if share.smallest_peak is not None:
        state.smallest_peak = share.smallest_peak if state.smallest_peak is None else min(state.smallest_peak,
                                                                                          share.smallest_peak)


def _take_replay(state: _State, builder: Callable[..., Spec], item: Candidate, est: Estimate | None,
                 seconds: float) -> None:
    if item.nodes >= RATE_MIN_NODES:  # a small replay's time is mostly building its programs, not its nodes
        state.replay_rate[0] += seconds
        state.replay_rate[1] += item.nodes
    if est is None:
        state.too_big_replayed += 1
        return
    if est.stalled:
        raise UserError(f"the replay of a legal candidate stalled ({est.stalled} nodes never ran): "
                        "please report this spec: " + ", ".join(f"{k}={v}" for k, v in item.values.items()))
    state.replayed += 1
    state.ranked.append(Ranked(item.values, builder(item.values), item.memory, item.bound, est))
    if len(state.best) < state.top:
        heapq.heappush(state.best, -est.step_us)
    elif -est.step_us > state.best[0]:
        heapq.heapreplace(state.best, -est.step_us)


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
