"""The layouts a search considers: every combination of the parallel sizes and training modes
a team chooses, as spec overrides. Legality is not decided here: each candidate goes through
the spec's own validator (spec.spec_builder), the one `generate` uses.

Axes (a value the user fixes with a flag, e.g. --tp 8 or --schedule 1f1b, is not varied):
- tp: divisors of the world up to the heads, within one node (dividing --gpus-per-node)
  unless --tp-across-nodes; sequence parallelism on whenever tp > 1 (as Megatron recommends;
  MoE with tp > 1 requires it);
- cp: divisors of what tp leaves; pp: divisors of what tp x cp leaves, at most the layers,
  each with the default split (even, shortfall from the outer stages) and, with pp > 1,
  Megatron's embedding/loss accounting as one layer each; dp: the rest; ep (MoE): divisors
  of dp x cp that divide the experts;
- micro-batch: divisors of global_batch / dp;
- schedule: 1f1b, gpipe, zb-h1, zbv, dualpipev, and interleaved / interleaved-zb with every
  virtual-stage count that splits the layers into whole chunks;
- recompute: none, selective, full; dp-mode: every row of config/dp_modes.py (ddp, zero1,
  zero2, dist-opt, zero3, hsdp), a replicating one (hsdp) sharded within one node, each with
  every overlap its row accepts (gradient reduction with the backward, the parameter gather
  with the forward), as Megatron's recipes run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from traceforge.config import DP_MODES as DP_MODE_RULES
from traceforge.config import Spec
from traceforge.config.dp_modes import DP_MODE_ALIASES, GRAD_REDUCE, PARAM_GATHER, DpModeRule
from traceforge.config.schedules import SCHEDULES as SCHEDULE_RULES
from traceforge.parallel.partition import split_counts

SCHEDULES = tuple(SCHEDULE_RULES)
RECOMPUTE = ("none", "selective", "full")
DP_MODES = tuple(DP_MODE_RULES)
SPLIT_ACCOUNTING = {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}
OTHER_SPLITS = ("layers_per_stage", "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class Model:
    """What the enumeration needs to know of the model and the step (from the base spec)."""

    world: int
    gpus_per_node: int
    layers: int
    heads: int
    experts: int
    global_batch: int
    tp_across_nodes: bool = False


def _fixed(fixed: Mapping[str, Any], name: str, values: list) -> list:
    return [fixed[name]] if fixed.get(name) is not None else values


def schedules(layers: int, pp: int, fixed: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(schedule, virtual stages) pairs for pp stages; chunk counts that split the layers (or the
    layers with the embedding and loss accounted) into whole chunks."""
    # Without a pipeline only the schedules that run on one stage (the others interleave or split
    # its stages); with one, every schedule, its own stage rules checked by the validator.
    names = _fixed(fixed, "schedule", [name for name in SCHEDULES if pp > 1 or SCHEDULE_RULES[name].min_pp == 1])
    out: list[tuple[str, int]] = []
    for name in names:
        chunk_rule = SCHEDULE_RULES[name].chunks if name in SCHEDULE_RULES else "one"
        if chunk_rule == "virtual":
            # Up to one layer per chunk, the embedding's and the loss's chunks then holding no layer
            # (Megatron builds such a chunk: get_num_layers_to_build asserts only >= 0 layers).
            chunks = [v for v in range(2, (layers + 2) // pp + 1)
                      if layers % (pp * v) == 0 or (layers + 2) % (pp * v) == 0]
            out += [(name, v) for v in _fixed(fixed, "virtual_stages", chunks)]
        else:
            out.append((name, 2 if chunk_rule == "v" else 1))
    return out


def _layouts(model: Model, fixed: Mapping[str, Any], partial: Mapping[str, Any]) -> list[dict[str, Any]]:
    world = model.world
    out = []
    tps = [t for t in divisors(world) if t <= model.heads and (model.tp_across_nodes or model.gpus_per_node % t == 0)]
    for tp in _fixed(fixed, "tp", tps):
        rest = world // tp if world % tp == 0 else 0
        for cp in _fixed(fixed, "cp", divisors(rest) if rest else []):
            if rest % cp:
                continue
            for pp in _fixed(fixed, "pp", [p for p in divisors(rest // cp) if p <= model.layers]):
                if (rest // cp) % pp:
                    continue
                dp = rest // cp // pp
                eps = [e for e in divisors(dp * cp) if model.experts % e == 0] if model.experts else [1]
                for ep in _fixed(fixed, "ep", eps):
                    out.append(dict(tp=tp, cp=cp, pp=pp, dp=dp, world_size=world, ep=ep,
                                    sequence_parallel=fixed.get("sequence_parallel", tp > 1)))
    return out


def _splits(model: Model, fixed: Mapping[str, Any], partial: Mapping[str, Any]) -> list[dict[str, Any]]:
    if partial["pp"] == 1 or any(fixed.get(k) is not None for k in (*SPLIT_ACCOUNTING, *OTHER_SPLITS)):
        return [{}]  # a split flag given fixes the axis (the validator judges it)
    p = partial["pp"]
    n = p * partial["virtual_stages"]  # the V schedules' two chunks a stage included (schedules())
    even, accounted = split_counts(model.layers, p, n), split_counts(model.layers, p, n, True, True)
    # The same layers on every chunk either way (e.g. 1F1B with 126 layers on 16 stages): one
    # candidate, not two that differ only in their flags.
    return [{}] + ([dict(SPLIT_ACCOUNTING)] if accounted is None or accounted != even else [])


def _micro_batches(model: Model, fixed: Mapping[str, Any], partial: Mapping[str, Any]) -> list[dict[str, Any]]:
    dp = partial["dp"]
    mbs = divisors(model.global_batch // dp) if model.global_batch % dp == 0 else []
    return [dict(micro_batch=mb) for mb in _fixed(fixed, "micro_batch", mbs)]


def _schedules(model: Model, fixed: Mapping[str, Any], partial: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(schedule=name, virtual_stages=vp) for name, vp in schedules(model.layers, partial["pp"], fixed)]


def _recomputes(model: Model, fixed: Mapping[str, Any], partial: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(recompute=r) for r in _fixed(fixed, "recompute", list(RECOMPUTE))]


def _dp_modes(model: Model, fixed: Mapping[str, Any], partial: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for mode, shard in dp_modes(partial["dp"], partial["tp"], partial["cp"], model.gpus_per_node, fixed):
        # Every overlap the mode accepts, as Megatron's recipes run (a fixed flag wins).
        rule = _rule(mode)
        overlaps = rule.overlaps if rule else ()
        out.append(dict(dp_mode=mode, shard_size=shard,
                        overlap_grad_reduce=fixed.get("overlap_grad_reduce", GRAD_REDUCE in overlaps),
                        overlap_param_gather=fixed.get("overlap_param_gather", PARAM_GATHER in overlaps)))
    return out


# The search tree, outermost first: each level adds these spec keys. The order follows the
# order in which the validator reads them, so a refusal at a level reads nothing deeper and
# removes the whole subtree with one call (most refusals are the schedule's, so the
# data-parallel modes, read last, come last); every level above the leaves is probed.
LEVELS = ((_layouts, ("tp", "cp", "pp", "dp", "world_size", "ep", "sequence_parallel")),
          (_micro_batches, ("micro_batch",)),
          (_recomputes, ("recompute",)),
          (_schedules, ("schedule", "virtual_stages")),
          (_splits, tuple(SPLIT_ACCOUNTING)),
          (_dp_modes, ("dp_mode", "shard_size", "overlap_grad_reduce", "overlap_param_gather")))


def count(model: Model, fixed: Mapping[str, Any], partial: Mapping[str, Any], level: int) -> int:
    """Candidates below a node of the tree (the node itself when it is a leaf)."""
    if level == len(LEVELS):
        return 1
    children = LEVELS[level][0](model, fixed, partial)
    if level == len(LEVELS) - 1:
        return len(children)
    return sum(count(model, fixed, {**partial, **child}, level + 1) for child in children)


# The keys of the partial candidate each level's function reads: the candidates below a node
# depend only on the keys the levels below it read, so layouts that agree on those share one count
# (tests/search/test_plan.py checks the reads with a dict that notes them).
READS = {_layouts: (), _micro_batches: ("dp",), _recomputes: (), _schedules: ("pp",),
         _splits: ("pp", "virtual_stages"), _dp_modes: ("dp", "tp", "cp")}


def layout_counts(model: Model, fixed: Mapping[str, Any], layouts: list[dict[str, Any]]) -> list[int]:
    """count(model, fixed, layout, 1) of each top-level layout, each distinct subtree counted once
    (counting every layout's tree anew took seconds at thousands of GPUs)."""
    memo: dict[tuple, int] = {}

    def below(partial: Mapping[str, Any], level: int) -> int:
        if level == len(LEVELS):
            return 1
        key = (level, tuple(partial.get(k) for fn, _ in LEVELS[level:] for k in READS[fn]))
        n = memo.get(key)
        if n is None:
            n = memo[key] = sum(below({**partial, **child}, level + 1) for child in LEVELS[level][0](model, fixed, partial))
        return n

    return [below(layout, 1) for layout in layouts]


def walk(model: Model, fixed: Mapping[str, Any], check: Callable[[dict[str, Any], set[str] | None], Spec | None],
         partial: Mapping[str, Any] | None = None, level: int = 0) -> Iterator[tuple[dict[str, Any], Spec | None, int]]:
    """(values, spec or None, candidates) for every leaf, or for a whole subtree the validator
    refused on keys above it: ``check(values, reads)`` returns the spec or None when refused,
    noting the keys it read; a refusal that read no key of a deeper level holds for the subtree."""
    partial = dict(partial or {})
    level_fn = LEVELS[level][0]
    deeper = {key for _, keys in LEVELS[level + 1:] for key in keys}
    for child in level_fn(model, fixed, partial):
        values = {**partial, **child}
        if level == len(LEVELS) - 1:
            yield values, check(values, None), 1
            continue
        reads: set[str] = set()
        spec = check(values, reads)
        if spec is None and not reads & deeper:
            yield values, None, count(model, fixed, values, level + 1)
        else:
            yield from walk(model, fixed, check, values, level + 1)


def _rule(mode: str) -> DpModeRule | None:
    """A mode's row (an alias's, as a fixed --dp-mode may name it); None for no mode: the validator refuses it."""
    return DP_MODE_RULES.get(DP_MODE_ALIASES.get(mode, mode))


def dp_modes(dp: int, tp: int, cp: int, gpus_per_node: int, fixed: Mapping[str, Any]) -> list[tuple[str, int | None]]:
    """(dp-mode, hsdp shard size) pairs for dp ranks."""
    out: list[tuple[str, int | None]] = []
    for mode in _fixed(fixed, "dp_mode", list(DP_MODES)):
        rule = _rule(mode)
        if rule and rule.replicas:
            # PyTorch's HYBRID_SHARD: shard inside a node, replicate across nodes.
            node = max(1, gpus_per_node // (tp * cp))
            sizes = [node] if 1 < node < dp and dp % node == 0 else []
            out += [(mode, s) for s in _fixed(fixed, "shard_size", sizes)]
        else:
            out.append((mode, None))
    return out
