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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from traceforge.base.errors import SpecError, UserError
from traceforge.base.pool import Shared, fan_out
from traceforge.config import LayerRun, Spec, spec_builder
from traceforge.machine.cluster import Cluster
from traceforge.memory.report import DOES_NOT_FIT, Band
from traceforge.model.flops import model_flops_per_step
from traceforge.search.bound import FLOOR_PROBE, layout_floor, recordings, replay_nodes_floor, step_lower_bound
from traceforge.search.estimate import Estimate, estimate
from traceforge.search.fits import memory_band
from traceforge.search.progress import SearchProgress
from traceforge.search.proof import BUDGET, TIMEOUT, Proof
from traceforge.search.ring_floor import ring_layout_floor
from traceforge.search.space import LEVELS, Model, _layouts, _micro_batches, layout_counts, walk
from traceforge.search.work import Work
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
    proof: Proof | None = None  # how far from exact the answer is (search/proof.py)


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


def _layout_floor(layout: dict[str, Any], record: bool = True) -> tuple[float, bool, tuple[tuple[Any, int], ...]]:
    """(a floor of a top-level layout, whether it is the recorded one, the layer recordings it
    read: what it cost, work.Work.floor): with record False, a layout with a p2p ring gets its
    ring's floor alone (ring_floor.py: a cost model per micro-batch size instead of thousands of
    recorded ops), the others their recorded floor."""
    assert _job is not None
    runs, empty = probes(_job.builder, _job.model, _job.fixed, layout)
    if empty:
        return EMPTY, True, ()  # no candidate to validate, nor to rank
    ring = ring_layout_floor(runs, layout["pp"])
    if ring > 0 and not record:
        return ring, False, ()
    floor = max(ring, layout_floor(runs, layout["pp"], _job.link))  # both never above a candidate's bound
    return floor, True, recordings(runs, _job.link)


EMPTY = float("inf")  # the floor of a layout without a legal candidate: never validated once one ranks


def _group_floors(group: list[dict[str, Any]]) -> list[tuple[float, bool, tuple[tuple[Any, int], ...]]]:
    """The first floors (_layout_floor, record False) of layouts that share their layer recordings
    (one tp, cp and ep), in one worker, whose memo then records each layer once for them all."""
    return [_layout_floor(layout, False) for layout in group]


def _floor_groups(tops: list[dict[str, Any]]) -> list[list[int]]:
    """The layouts (indices into tops) in groups of one (tp, cp, ep), cheapest first: a long
    context-parallel ring records thousands of transfers per layer, so the largest cp last."""
    groups: dict[tuple, list[int]] = {}
    for i in sorted(range(len(tops)), key=lambda i: tops[i]["cp"]):
        groups.setdefault((tops[i]["tp"], tops[i]["cp"], tops[i]["ep"]), []).append(i)
    return list(groups.values())


def search(base: Base, model: Model, fixed: Mapping[str, Any], link: Cluster, gpu_memory: int | None,
           top: int, every: bool = False, jobs: int = 1, shard: tuple[int, int] | None = None,
           quiet: bool = False, until_us: float | None = None, budget: int | None = None,
           overhead_bytes: int | None = None, reserve: float | None = None, timeout_s: float | None = None) -> PlanResult:
    """until_us: also replay every candidate whose bound is below it (and keep them all), so the
    rank of a layout of that step among all candidates is exact (the published-run check).
    budget: the work (search/work.py) the search may spend, floors, validating, sizing and
    replaying included, before it stops (once one candidate is ranked); the result then says
    how many candidates and layouts could still have ranked and the lowest step they could
    reach. Every decision the budget drives depends on the work counted and a fixed order only,
    so the answer is the same with any --jobs, on any machine. timeout_s: a wall-clock cap, the
    one thing that makes an answer depend on the machine: the result says when it cut the search."""
    global _job
    started = time.perf_counter()
    timeout_at = None if timeout_s is None else started + timeout_s
    _job = _Job(base, model, fixed, link, gpu_memory, overhead_bytes, reserve)
    builder = _job.builder
    result = PlanResult(model.world, gpu_memory_bytes=gpu_memory or 0)
    tops = layouts(model, fixed, shard)
    work = Work(budget)
    progress = SearchProgress(model.world, len(tops), quiet, work, timeout_s)
    # Every layout gets a floor before anything is validated, so that whenever the budget ends the
    # plan can say how far its best is from the best layout: the recorded floor of each layout
    # without a ring and the cheap ring floor of each layout with one (ring_floor.py); a ring
    # layout's recorded floor is made when it comes first in the queue (_branch_and_bound).
    floors: list[tuple[float, bool]] = [(0.0, False)] * len(tops)
    groups = _floor_groups(tops)
    found = fan_out(_group_floors, ([tops[i] for i in g] for g in groups), jobs, shared=_shared())
    for group, answers in zip(groups, found, strict=True):  # in order: each recording charged once, the same way
        for i, (floor, recorded, read) in zip(group, answers, strict=True):
            floors[i] = (floor, recorded)
            work.charge(work.floor(read))
            progress.bounded()
    sizes = {id(layout): n for layout, n in zip(tops, layout_counts(model, fixed, tops), strict=True)}  # candidates per layout
    state = _branch_and_bound(builder, [(f, r, t) for (f, r), t in zip(floors, tops, strict=True)], sizes, top, every,
                              until_us, jobs, work, timeout_at, progress)
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
    left = [c.bound for c in state.left] + [f for f, _ in state.left_layouts if f != EMPTY]
    result.proof = Proof(
        limit=None if every or until_us is not None else top, shown=len(result.candidates),
        best_ms=result.candidates[0].step_ms if result.candidates else None,
        floor_ms=min(left) / 1e3 if left else None, kth_ms=None if limit == float("inf") else limit / 1e3,
        layouts_not_validated=len(tops) - state.expanded,
        candidates_not_replayed=state.feasible - state.replayed - state.too_big_replayed,
        layouts_could_rank=len(unsearched), candidates_could_rank=len(could_rank), replayed=state.replayed,
        too_big=result.too_big, budget=budget, budget_spent=work.spent, timeout_s=timeout_s,
        stopped_by=state.stopped_by if could_rank or unsearched else None)
    result.seconds = time.perf_counter() - started
    return result


# -- phase 2: replay in bound order ---------------------------------------------------------

def _replay(item: Candidate) -> Estimate | None:
    """One candidate's estimate (None past the replay's node limit)."""
    assert _job is not None
    try:
        return estimate(_job.builder(item.values), _job.link)
    except ReplayTooBig:  # millions of nodes: not ranked, counted
        return None


REFINE, VALIDATE, REPLAY = "refine", "validate", "replay"  # a task's kind: a layout's recorded floor, its validation, a replay
NOOP = ("noop", None)  # what a worker is handed when no task is known yet


def _task(task: tuple[Any, Any]) -> tuple[Any, tuple[str, Any]]:
    """A worker's task, (its name, the answer or the exception it raised): name[0] is its kind."""
    name, item = task
    try:
        if name[0] == REFINE:
            return name, ("ok", _layout_floor(item.layout))
        if name[0] == VALIDATE:
            return name, ("ok", _filter_layout(item.layout))
        if name[0] == REPLAY:
            return name, ("ok", _replay(item))
        return name, ("ok", None)
    except Exception as exc:  # raised where the search takes the answer: a task run ahead may never be
        return name, ("error", exc)


class _Runner:
    """Runs the search's tasks one at a time, in the order its decisions make: the answer of each
    is taken before the next is decided, as in one process, so the answer never depends on the
    order in which worker processes finish. With workers, the idle ones run ahead on the tasks
    `ahead` names (the first of the queue that the decisions so far would start), kept until the
    search asks for them or ends; a task run ahead changes no decision, only the time it takes."""

    def __init__(self, jobs: int, ahead: Callable[[], Iterator[tuple[Any, Any]]]):
        self.jobs, self.ahead = jobs, ahead
        self.sent: set[Any] = set()
        self.done: dict[Any, tuple[str, Any]] = {}
        self.wanted: tuple[Any, Any] | None = None
        self.results: Iterator[tuple[Any, tuple[str, Any]]] | None = None

    def _feed(self) -> Iterator[tuple[Any, Any]]:
        while True:
            task = self.wanted if self.wanted is not None and self.wanted[0] not in self.sent else None
            if task is None:
                task = next((t for t in self.ahead() if t[0] not in self.sent), NOOP)
            if task is not NOOP:
                self.sent.add(task[0])
            yield task

    def run(self, task: tuple[Any, Any]) -> Any:
        if self.jobs == 1:
            answer = _task(task)[1]
        else:
            name = task[0]
            if name not in self.done:
                if self.results is None:
                    self.results = fan_out(_task, self._feed(), self.jobs, shared=_shared())
                self.wanted = task
                try:
                    while name not in self.done:
                        got, reply = next(self.results)
                        if got != NOOP[0]:
                            self.done[got] = reply
                finally:
                    self.wanted = None
            answer = self.done.pop(name)
        if answer[0] == "error":
            raise answer[1]
        return answer[1]

    def close(self) -> None:
        if self.results is not None:
            self.results.close()  # type: ignore[attr-defined]  # a generator: kills the workers


@dataclass
class _Top:
    """A top-level layout in the queue: its floor, and whether it is the recorded one."""

    floor: float
    layout: dict[str, Any]
    recorded: bool


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
    left: list[Candidate] = field(default_factory=list)  # candidates the search left unreplayed
    left_layouts: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # layouts it left unvalidated
    nodes: list[int] = field(default_factory=lambda: [0, 0])  # nodes replayed, their floors' sum
    stopped_by: str | None = None  # BUDGET or TIMEOUT, when one ended the search

    def kth(self) -> float | None:
        return -self.best[0] if len(self.best) >= self.top else None

    def replay_cost(self, c: Candidate) -> int:
        """What replaying c is expected to cost: its node floor at the ratio of nodes replayed to
        their floors so far (1 before the first: MoE programs hold 2-3 times their floor)."""
        replayed, floors = self.nodes
        return Work.replay(c.nodes * replayed // floors if floors else c.nodes)


def _branch_and_bound(builder: Callable[..., Spec], layouts: list[tuple[float, bool, dict[str, Any]]],
                      sizes: dict[int, int], top: int, every: bool, until_us: float | None, jobs: int, work: Work,
                      timeout_at: float | None, progress: SearchProgress) -> _State:
    """Layouts (with their floors) and candidates in one queue by bound: a layout whose floor is
    not the recorded one gets it when it comes first (its ring's floor is a cost model's: most
    never come first), a layout with its recorded floor is validated when it comes first (its
    candidates join the queue, each at least its layout's floor), a candidate replayed; it ends
    when the next bound is above the K-th best replayed step, so no layout whose floor is above
    it is validated at all.

    With a budget it also ends once the work spent reaches it (and one candidate is ranked); a
    replay whose expected cost (state.replay_cost) is more than the work left is not started,
    in favour of the next ones in bound order, and is left for the certificate (its bound), as
    is everything still queued. Until a layout has given a candidate that fits, layouts are
    validated whatever the budget; if no candidate found can be replayed within it, the
    cheapest (fewest replay nodes) is replayed anyway, so a plan always ranks one. The clock
    (timeout_at, perf_counter seconds) is read only to stop, once one candidate is ranked."""
    state = _State(top)
    queue: list[tuple[float, int, tuple, int]] = []  # (bound, 0 layout / 1 candidate, key, id)
    items: dict[int, Any] = {}
    ids = itertools.count()

    def push(bound: float, kind: int, key: tuple, item: Any) -> None:
        i = next(ids)
        items[i] = item
        heapq.heappush(queue, (bound, kind, key, i))

    for floor, recorded, layout in layouts:
        push(floor, 0, sort_key(layout), _Top(floor, layout, recorded))

    def pruned(bound: float) -> bool:
        kth = state.kth()
        # strictly: a candidate whose step ties the K-th may still rank before it
        return not every and kth is not None and bound > max(kth, until_us or 0.0)

    def task(kind: int, key: tuple, item: Any) -> tuple[Any, Any] | None:
        """The task that takes a queued item on, or None when the budget passes over it."""
        if kind == 1:
            return None if state.replay_cost(item) > work.left() else ((REPLAY, key), item)
        if state.feasible and work.exhausted():  # until a candidate fits, layouts are validated whatever the budget
            return None
        return ((VALIDATE if item.recorded else REFINE, key), item)

    def ahead() -> Iterator[tuple[Any, Any]]:
        """The tasks the decisions so far would start next, in queue order (the workers' guess)."""
        if state.ranked and work.exhausted():
            return
        for bound, kind, key, i in _in_order(queue):
            if pruned(bound):
                return
            t = task(kind, key, items[i])
            if t is not None:
                yield t

    runner = _Runner(jobs, ahead)
    try:
        while True:
            if not queue:
                if state.ranked or not state.left:
                    break
                # none could be replayed within the budget: the cheapest is, so a plan ranks one
                first = min(state.left, key=lambda c: (c.nodes, c.bound, c.key))
                state.left.remove(first)
                _take_replay(state, builder, first, runner.run(((REPLAY, first.key), first)), work)
                progress.update(state, len(queue))
                continue
            bound, kind, key, i = queue[0]
            if pruned(bound):
                break
            if state.ranked and work.exhausted():
                state.stopped_by = BUDGET
                break
            if state.ranked and timeout_at is not None and time.perf_counter() > timeout_at:
                state.stopped_by = TIMEOUT
                break
            heapq.heappop(queue)
            item = items.pop(i)
            t = task(kind, key, item)
            if t is None:  # passed over: left for the certificate
                state.stopped_by = BUDGET
                if kind == 1:
                    state.left.append(item)
                else:
                    state.left_layouts.append((item.floor, item.layout))
                continue
            answer = runner.run(t)
            if t[0][0] == REFINE:
                floor, _, read = answer
                work.charge(work.floor(read))
                floor = max(floor, item.floor)
                push(floor, 0, key, _Top(floor, item.layout, True))
            elif t[0][0] == VALIDATE:
                _take_share(state, answer, work)
                for c in answer.feasible:  # each at least its layout's floor (equal but for rounding)
                    push(max(c.bound, item.floor), 1, c.key, c._replace(bound=max(c.bound, item.floor)))
            else:
                _take_replay(state, builder, item, answer, work)
            progress.update(state, len(queue))
    finally:
        runner.close()
    for entry in queue:
        item = items[entry[3]]
        if entry[1] == 1:
            state.left.append(item)
        else:
            state.left_layouts.append((item.floor, item.layout))
    state.ranked.sort(key=lambda r: (r.estimate.step_us, sort_key(r.values)))
    if not (every or until_us is not None):
        state.ranked = state.ranked[:top]
    return state


def _in_order(heap: list[tuple]) -> Iterator[tuple]:
    """A heap's entries in increasing order, lazily (the first k in O(k log k), the heap untouched)."""
    if not heap:
        return
    frontier = [(heap[0], 0)]
    while frontier:
        entry, i = heapq.heappop(frontier)
        yield entry
        for child in (2 * i + 1, 2 * i + 2):
            if child < len(heap):
                heapq.heappush(frontier, (heap[child], child))


def _take_share(state: _State, share: _Share, work: Work) -> None:
    state.expanded += 1
    state.legal += share.legal
    state.feasible += len(share.feasible)
    state.too_big += share.too_big
    work.charge(Work.validation(share.legal))
    if share.smallest_peak is not None:
        state.smallest_peak = share.smallest_peak if state.smallest_peak is None else min(state.smallest_peak,
                                                                                          share.smallest_peak)


def _take_replay(state: _State, builder: Callable[..., Spec], item: Candidate, est: Estimate | None, work: Work) -> None:
    work.charge(Work.replay(item.nodes if est is None else est.nodes))
    if est is None:
        state.too_big_replayed += 1
        return
    state.nodes[0] += est.nodes
    state.nodes[1] += item.nodes
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
