"""A lower bound on a candidate's replayed step time, without building its programs.

The search replays candidates in increasing bound order and stops once the bound passes the
K-th best replayed step (branch and bound), so the bound must never exceed the replay:

- one layer's forward (or backward) is recorded into a scratch builder by the same
  LayerTemplate the stage programs use; its longest dependency path, compute at its recorded
  duration and each transfer at its cheapest link class (latency + wire bytes / bandwidth, the
  replay's own charge, never more), is a floor for that layer: every op of the next layer
  follows this layer's stream position, so floors of consecutive layers add;
- a stage computes its chunks' forward and backward once per micro-batch, one compute at a
  time;
- pipeline fill: a stage cannot start before micro-batch 0's forward has passed every earlier
  virtual stage; drain (schedules whose backward is not split, where a stage's last layer
  compute is a full backward): the gradient then still crosses every earlier virtual stage;
- one micro-batch's path: its forward through every virtual stage, then its backward (without
  the weight-gradient GEMMs a zero-bubble schedule defers) back through every one: with few
  micro-batches per stage (one, at the largest data-parallel sizes) the stages wait on each
  other and this, not a stage's own work, is the floor;
- on these paths every crossing between virtual stages on two stages is a send the receiver's
  compute waits for (its recv gates it), at the replay's cheapest charge for the pair's link
  class; and where the sender's next compute waits for its sends (Megatron's schedules without
  --overlap-p2p-comm, ScheduleGPipe before its first backward) they are on the stage's own path.

- the data-parallel traffic and the optimizer (dp_bound.py): a DP group's collectives one
  after another, and what follows a stage's last backward compute.

The sharing of links, compute slowed beside NCCL's kernels and waiting for peers are left out:
they only add to the replay.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from dataclasses import dataclass

import numpy as np

from traceforge.config import LayerRun, PipelineConfig, Spec
from traceforge.config.routing import BALANCED
from traceforge.config.schedules import SCHEDULES
from traceforge.ir.enums import NodeType
from traceforge.machine.cluster import Cluster
from traceforge.model.compute import CostModel
from traceforge.model.params import activation_bytes, is_moe_layer, moe_layers, p2p_message_bytes
from traceforge.parallel.layout import Layout, LayoutKey
from traceforge.parallel.partition import chunks_of, layers_of, placement, placement_in, virtual_stage, virtual_stage_in
from traceforge.parallel.pipeline import passes_of
from traceforge.program.embedding import embedding_backward, embedding_forward, head_backward, head_forward
from traceforge.program.layer import LayerTemplate
from traceforge.program.ops import Op, ProgramBuilder
from traceforge.program.stage import layer_group_sizes
from traceforge.program.tensor import TensorParallel
from traceforge.search.dp_bound import ROUNDING_US, UNSPLIT, stage_floors, unit_gathers


@dataclass(frozen=True)
class Piece:
    forward: float
    backward: float
    nodes: int = 0  # ops one micro-batch records through it, forward and backward (a floor for MoE)
    backward_input: float = 0.0  # the backward without its weight-gradient GEMMs (a zero-bubble I pass)
    recorded: int = 0  # ops its recordings made (forward, backward, input-gradient backward): what it cost


def _floor(ops: list[Op], sizes: dict[str, int], link: Cluster) -> float:
    """Longest path through a scratch recording's ops (ids are topological)."""
    end: list[float] = []
    for op in ops:
        if op.type == NodeType.COMP:
            cost = float(op.duration_micros)
        elif op.type == NodeType.COLL:
            assert op.comm_type is not None and op.group is not None
            cost = link.floor_micros(int(op.comm_type), op.comm_size, sizes[op.group], None)
        elif op.type == NodeType.SEND:
            cost = link.floor_send(op.comm_size, None)
        else:
            cost = 0.0
        end.append(max((end[d] for d in op.deps), default=0.0) + cost)
    return max(end, default=0.0)


def _record(spec: LayerRun, link: Cluster, emit, only_compute: bool = False, input_only: bool = False
            ) -> tuple[float, int, int]:
    """(floor, ops counted, ops recorded); only_compute: count compute ops only (an MoE layer's
    transfers depend on the routing of each micro-batch, its computes do not); input_only: the
    weight-gradient GEMMs kept aside, as a zero-bubble schedule's input-gradient pass records them."""
    b = ProgramBuilder(0, layer_group_sizes(spec))
    if input_only:
        b.split_backward = []
    emit(b)
    ops = b.program.ops
    nodes = sum(op.type == NodeType.COMP for op in ops) if only_compute else len(ops)
    return max(0.0, _floor(ops, b.group_sizes, link) - ROUNDING_US), nodes, len(ops)


def _piece(spec: LayerRun, link: Cluster, fwd, bwd, only_compute: bool = False) -> Piece:
    (f, f_nodes, f_ops), (b, b_nodes, b_ops) = _record(spec, link, fwd, only_compute), _record(spec, link, bwd, only_compute)
    b_input, _, i_ops = _record(spec, link, bwd, input_only=True)
    return Piece(f, b, f_nodes + b_nodes, b_input, f_ops + b_ops + i_ops)


def _pieces(spec: LayerRun, link: Cluster) -> dict[str, Piece]:
    """Floors of one layer (dense and MoE), the embedding and the LM head, per micro-batch."""
    return _layer_pieces(one_microbatch(spec), link)


def one_microbatch(spec: LayerRun) -> LayerRun:
    """The layer's run in a step of one micro-batch, where that serves every micro-batch count: a
    layer's ops read the count only to number p2p tags, and an MoE layer's routing to draw
    imbalanced counts (balanced routing moves the same copies in every micro-batch); so one
    recording serves every pipeline depth and data-parallel size of a (tp, cp, ep) layout."""
    if spec.experts and spec.moe_routing != BALANCED:
        return spec.run
    return _one_microbatch(spec.run)


@functools.lru_cache(maxsize=4096)
def _one_microbatch(run: LayerRun) -> LayerRun:
    return dataclasses.replace(run, num_microbatches=1)


def _record_pieces(spec: LayerRun, link: Cluster) -> dict[str, Piece]:
    cost = CostModel(spec)
    tp = TensorParallel(activation_bytes(spec), spec.tp, spec.sequence_parallel)  # the embedding's and head's
    # The layers' TP as the programs run it (program/stage.py): TransformerEngine's, with FP8
    # gathers and --tp-comm-overlap's ring exchanges; a plain one charges more than the replay.
    template = LayerTemplate(spec, TensorParallel.for_layers(spec), cost)

    def layer(index: int, moe: bool) -> Piece:
        def fwd(b: ProgramBuilder) -> None:
            b.ctx.layer, b.ctx.microbatch = index, 0
            template.forward(b, index)

        def bwd(b: ProgramBuilder) -> None:
            b.ctx.layer, b.ctx.microbatch, b.ctx.phase = index, 0, "bwd"
            if spec.recompute == "full":
                template.forward(b, index, recompute=True)
            template.backward(b, index, recompute_core=spec.recompute == "selective")

        return _piece(spec, link, fwd, bwd, only_compute=moe)

    out = {"embed": _piece(spec, link, lambda b: embedding_forward(b, tp, cost, spec),
                           lambda b: embedding_backward(b, tp, cost)),
           "head": _piece(spec, link, lambda b: head_forward(b, tp, cost, spec),
                          lambda b: head_backward(b, tp, cost))}
    kinds = {is_moe_layer(spec, i): i for i in range(spec.layers)}
    for moe, index in kinds.items():
        out["moe" if moe else "dense"] = layer(index, moe)
    return out


# Memoised on the layer's run (one_microbatch's) and the link: all a recording reads.
_layer_pieces = functools.lru_cache(maxsize=4096)(_record_pieces)


def recordings(runs: list[LayerRun], link: Cluster) -> tuple[tuple[LayerRun, int], ...]:
    """The layer recordings the floors of `runs` read, each as (its memo's key, the ops recorded to
    make it): what those floors cost the first time, whichever process or memo makes them (the
    search charges each key once, search/work.py)."""
    return tuple((key, sum(p.recorded for p in _layer_pieces(key, link).values()))
                 for key in dict.fromkeys(one_microbatch(run) for run in runs))


def replay_nodes_floor(spec: LayerRun, link: Cluster) -> int:
    """Fewest nodes the replay of spec takes (timing/engine.py sums its rank classes' programs): each
    stage is a class of its own (its program or its neighbours' differ, up the chain from the
    stage that holds the embedding), and a stage's program holds every pass of its layers, the
    embedding and the head, for every micro-batch and step. So a candidate above the replay's
    node limit by this count is set aside without building its programs."""
    pieces = _pieces(spec, link)
    moe = _moe_layers(spec.model)
    per_microbatch = pieces["embed"].nodes + pieces["head"].nodes + sum(
        count * pieces[kind].nodes for kind, count in (("dense", spec.layers - moe), ("moe", moe)) if count)
    return spec.steps * spec.num_microbatches * per_microbatch


_moe_layers = functools.lru_cache(maxsize=256)(moe_layers)  # per candidate: once per model


# A stage's sends to its next and previous stage: True when every rank's crosses nodes, False
# when none does, None when some do (the cheaper link class is then charged).
Links = tuple[tuple[bool | None, bool | None], ...]


def pipeline_links(spec: Spec, gpus_per_node: int) -> Links:
    """Per stage: whether its ranks' sends to the next and to the previous stage cross nodes."""
    return _links(LayoutKey.of(spec), gpus_per_node)


@functools.lru_cache(maxsize=8192)
def _links(key: LayoutKey, gpus_per_node: int) -> Links:
    layout = Layout.of(key)
    node = np.arange(layout.world_size) // gpus_per_node
    stage_of = layout.coords["pp"]

    def crosses(peer: np.ndarray, ranks: np.ndarray) -> bool | None:
        across = node[peer[ranks]] != node[ranks]
        return True if across.all() else False if not across.any() else None

    nxt, prv = layout.pipeline_peers
    return tuple((crosses(nxt, r), crosses(prv, r))
                 for r in (np.flatnonzero(stage_of == s) for s in range(layout.sizes["pp"])))


@functools.lru_cache(maxsize=65536)
def _blocking_sends(name: str, stage: int, p: int, m: int, v: int, blocking: bool) -> tuple[tuple[tuple[int, ...], int], ...]:
    """The sends a stage's compute waits for within one step, as (virtual-stage boundaries sent
    across in one batch, how many such batches): each boundary k is the one between virtual
    stages k and k+1. Megatron without --overlap-p2p-comm (blocking) posts a pass's sends, and
    an F& pair's two, as one batch the next compute waits for (program/stage.py); the step's last
    batch follows its last compute, so it is not counted (the drain counts a gradient's). torch's
    ScheduleGPipe waits for its forward sends before its first backward."""
    rule = SCHEDULES[name]
    vs = [virtual_stage_in(name, p, stage, c) for c in range(v)]
    stage_at = [placement_in(name, p, k)[0] for k in range(p * v)]

    def sends(kind: str, chunk: int) -> tuple[int, ...]:
        k = vs[chunk]
        if kind in ("F", "F&"):
            return (k,) if k + 1 < p * v and stage_at[k + 1] != stage else ()
        if kind in ("B", "I"):
            return (k - 1,) if k > 0 and stage_at[k - 1] != stage else ()
        return ()  # a W pass sends nothing

    passes = passes_of(name, stage, p, m, v)
    groups: list[tuple[int, ...]] = []
    i = 0
    while i < len(passes):
        kind, chunk, _ = passes[i]
        batch = sends(kind, chunk)
        if kind == "F&" and i + 1 < len(passes) and passes[i + 1][0] == "B":
            i += 1
            batch += sends("B", passes[i][1])
        groups.append(batch)
        i += 1
    out: Counter[tuple[int, ...]] = Counter()
    if blocking:
        out.update(batch for batch in groups[:-1] if batch)
    elif rule.drain_forward_sends:
        first_backward = next((k for k, (kind, _, _) in enumerate(passes) if kind == "B"), 0)
        if first_backward and groups[first_backward - 1]:
            out[groups[first_backward - 1]] += 1
    return tuple(sorted(out.items()))


# Memoised on what it reads: the layer's run and the pipeline (not the data parallelism), the
# link, and the gathers and links it is given.
@functools.lru_cache(maxsize=65536)
def _pipeline(spec: LayerRun, pipeline: PipelineConfig, link: Cluster, gathers: tuple[tuple[float, ...], ...] | None = None,
              links: Links | None = None) -> tuple[list[float], float, list[float]]:
    """(per stage: when its last compute can end at the earliest, the whole pipeline's earliest
    end: the last micro-batch's gradient back through every virtual stage, per stage: when the
    last step's last-micro-batch backward of one of its chunks can start at the earliest), over
    all steps. gathers: ZeRO-3's per-unit parameter gathers per virtual stage (dp_bound.unit_gathers);
    links: pipeline_links (None: either link class)."""
    pieces = _pieces(spec, link)
    ranges = layers_of(pipeline, spec.layers)
    n = len(ranges)

    def vstage(j: int) -> Piece:
        units = [pieces["embed"]] if j == 0 else []
        units += [pieces["moe" if is_moe_layer(spec, i) else "dense"] for i in ranges[j]]
        units += [pieces["head"]] if j == n - 1 else []
        f, b = sum(u.forward for u in units), sum(u.backward for u in units)
        bi = sum(u.backward_input for u in units)
        if gathers is None or not units:
            return Piece(f, b, 0, bi)
        g = gathers[j]
        assert len(g) == len(units)
        # A pass: its first gather then every compute, or every gather then its last compute
        # (dp_bound.unit_gathers); the backward runs the units in reverse.
        return Piece(max(g[0] + f, sum(g) + units[-1].forward), max(g[-1] + b, sum(g) + units[0].backward), 0,
                     max(g[-1] + bi, sum(g) + units[0].backward_input))

    charges: dict[bool | None, float] = {}

    def hop(k: int) -> float:
        """An activation from virtual stage k to k+1 (or its gradient back): a send that starts
        after the sender's compute and that the receiver's next compute waits for (its recv
        gates it), at the replay's cheapest charge for the pair's link class; nothing when both
        are on one stage (the bottom of a V) or beyond the model's ends."""
        if pipeline.pp == 1 or k + 1 >= n:
            return 0.0
        a, b = placement(pipeline, k)[0], placement(pipeline, k + 1)[0]
        if a == b:
            return 0.0
        inter = None if links is None else links[a][0 if b == (a + 1) % pipeline.pp else 1]
        if inter not in charges:
            # its 1/t part when split over TP (the receiver's AllGather left out: still a floor)
            charges[inter] = link.floor_send(p2p_message_bytes(spec, pipeline.pipeline_scatter_gather), inter)
        return charges[inter]

    per = [vstage(j) for j in range(n)]
    hops = [hop(k) for k in range(n)]
    fill = [0.0]
    drain = [0.0]
    for p, t in zip(per, hops, strict=True):
        fill.append(fill[-1] + p.forward + t)
        drain.append(drain[-1] + p.backward + t)
    m = spec.num_microbatches
    unsplit = pipeline.schedule in UNSPLIT
    # One micro-batch's forward crosses every virtual stage in order, then its backward every one
    # back (each waits for the next one's gradient): a dependency path through the whole model,
    # whatever the schedule; a zero-bubble schedule may defer the weight-gradient GEMMs off it.
    chain = fill[-1] + sum(p.backward + t if unsplit else p.backward_input + t for p, t in zip(per, hops, strict=True))
    blocking = SCHEDULES[pipeline.schedule].framework == "megatron" and not pipeline.overlap_p2p_comm
    ends, whole, starts = [], chain, []
    for stage in range(pipeline.pp):
        vstages = [virtual_stage(pipeline, stage, c.index) for c in chunks_of(pipeline, spec.layers, stage)]
        chunks = [per[j] for j in vstages]
        first = min(vstages)
        # The sends between two of the stage's computes that the later one waits for.
        sends = sum(count * max(hops[k] for k in batch) for batch, count in
                    _blocking_sends(pipeline.schedule, stage, pipeline.pp, m, pipeline.virtual_stages, blocking))
        work = m * sum(c.forward + c.backward for c in chunks) + sends
        ends.append(fill[first] + spec.steps * work)
        whole = max(whole, ends[-1] + (drain[first] if unsplit else 0.0))
        # A chunk's last backward follows, on the stage's one compute stream, every forward of
        # the chunk (its first after the fill reached it) and, unless weight-gradient passes
        # are split off and deferred (zero-bubble schedules), every earlier backward; and in a
        # later step, all the stage's work of the steps before.
        earlier = fill[first] + (spec.steps - 1) * work
        starts.append(min(max(fill[j], earlier) + m * c.forward + ((m - 1) * c.backward if unsplit else 0.0)
                          for j, c in zip(vstages, chunks, strict=True)))
    assert placement(pipeline, 0)[0] == 0  # the model starts on stage 0 in every schedule
    return ends, whole, starts


def step_lower_bound(spec: Spec, link: Cluster) -> float:
    """Microseconds the replay of spec's step cannot beat (per step, as the estimate)."""
    ends, pipeline, starts = _pipeline(spec.run, spec.pipeline, link, unit_gathers(spec, link),
                                       pipeline_links(spec, link.gpus_per_node))
    floors = stage_floors(spec, link)
    # Stage 0 holds virtual stage 0, where the drain ends: its step tail follows the pipeline.
    best = pipeline + floors[0].tail
    for end, start, floor in zip(ends, starts, floors, strict=True):
        # A step's once-per-step data-parallel collectives (gradient buckets, parameter
        # gathers) are issued from its chunks' last-micro-batch backwards on: after `start`.
        best = max(best, end + floor.tail, spec.steps * floor.chain, start + floor.after_backward)
    return best / spec.steps


# The values a layout's floor is computed at: the least compute per micro-batch (no recomputation:
# full and selective recomputation only add ops to a layer's backward), on a schedule and mode
# every layout admits. Neither the schedule nor the dp mode is read by the layer floors.
FLOOR_PROBE = dict(recompute="none", schedule="1f1b", virtual_stages=1, dp_mode="ddp", shard_size=None,
                   overlap_grad_reduce=True, overlap_param_gather=False)


def layout_floor(runs: list[LayerRun], pp: int, link: Cluster) -> float:
    """Microseconds per step no candidate of one top-level layout (tp, cp, pp, dp, ep) can beat,
    from its layer's run at each micro-batch size (FLOOR_PROBE's values): its busiest stage
    computes at least its share (1/pp) of every micro-batch's forward and backward of the whole
    model, and at least ceil(layers / pp) layers' (whatever the split and the chunks, some stage
    holds that many), and step_lower_bound's stage term (m x its chunks' work) is at least that
    for every schedule, split, recomputation and dp mode; and one micro-batch's path (_pipeline's
    chain) is at least its forward and input-gradient backward through every layer. No run: 0."""
    best = float("inf")
    for run in runs:
        pieces = _pieces(run, link)
        layers = [pieces["moe" if is_moe_layer(run, i) else "dense"] for i in range(run.layers)]
        units = [pieces["embed"], pieces["head"]] + layers
        work = sum(u.forward + u.backward for u in units)
        busiest = -(-run.layers // pp) * min(u.forward + u.backward for u in layers)
        path = sum(u.forward + u.backward_input for u in units)  # one micro-batch's path (_pipeline's chain)
        best = min(best, max(run.num_microbatches * max(work / pp, busiest), path))
    return 0.0 if best == float("inf") else best
