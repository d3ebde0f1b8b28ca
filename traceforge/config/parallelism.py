"""The parallel layout: tp, cp, ep, pp, dp and the world they make, the rank order, and context
parallelism's kind."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from traceforge.base.errors import SpecError
from traceforge.base.limits import MAX_WORLD_SIZE
from traceforge.config.presets import get_preset
from traceforge.config.raw import Raw

MEGATRON_ORDER = "tp-cp-ep-dp-pp"
ORDER_ALIASES = {"megatron": MEGATRON_ORDER}
KNOWN_DIMS = ("tp", "cp", "ep", "dp", "pp")
REQUIRED_DIMS = ("tp", "pp", "dp")


def normalize_order(order: str) -> str:
    order = ORDER_ALIASES.get(order.strip().lower(), order.strip().lower())
    dims = order.split("-")
    for dim in dims:
        if dim not in KNOWN_DIMS:
            raise SpecError(f"order {order!r}: unknown dimension {dim!r}; use dimensions from {'-'.join(KNOWN_DIMS)} innermost first, or 'megatron'")
    if len(set(dims)) != len(dims):
        raise SpecError(f"order {order!r} names a dimension twice; name each of tp, pp, dp once")
    missing = [d for d in REQUIRED_DIMS if d not in dims]
    if missing:
        raise SpecError(f"order {order!r} lacks {', '.join(missing)}; it must name tp, pp and dp, e.g. tp-pp-dp")
    return order


def normalize(r: Raw, v: dict) -> dict:
    tp, pp, cp, ep = r.need("tp"), r.need("pp"), r.get("cp", 1), r.get("ep", 1)
    model_parallel = tp * cp * pp
    # dp: derived from world_size unless dp itself is given at least as explicitly.
    world = r.get("world_size")
    if world is not None and "world_size" in r.explicit and "dp" not in r.explicit:
        if world % model_parallel:
            raise SpecError(f"world_size {world} is not divisible by tp*cp*pp = {model_parallel}: pick a multiple of {model_parallel}")
        dp = world // model_parallel
    else:
        dp = r.need("dp")
    if world is None:
        world = model_parallel * dp
    if world != model_parallel * dp:
        raise SpecError(f"world_size {world} != tp*cp*pp*dp = {model_parallel * dp}: drop --dp to derive it, or fix one of them")
    if world > MAX_WORLD_SIZE:
        raise SpecError(f"world_size {world:,} (tp*cp*pp*dp) is above the {MAX_WORLD_SIZE:,} ranks traceforge plans: lower a size")
    heads, kv_heads = v["heads"], v["kv_heads"]
    fixed_world = world if "world_size" in r.explicit and "dp" not in r.explicit else None
    if heads % tp:
        raise SpecError(f"heads ({heads}) must be divisible by tp ({tp}): {tp_choices(r, v, cp, pp, fixed_world)}")
    if kv_heads % tp:
        raise SpecError(f"kv_heads ({kv_heads}) must be divisible by tp ({tp}), as Megatron requires: "
                        f"{tp_choices(r, v, cp, pp, fixed_world)}")
    if v["ffn_hidden"] % tp:
        raise SpecError(f"ffn_hidden ({v['ffn_hidden']}) must be divisible by tp ({tp}): "
                        f"{tp_choices(r, v, cp, pp, fixed_world)}")
    # The embedding and the loss, accounted as layers, may each fill a stage (Megatron builds one
    # with no transformer layer); otherwise every stage needs a layer.
    accounted = bool(r.get("account_for_embedding_in_pipeline_split")) + bool(r.get("account_for_loss_in_pipeline_split"))
    if v["layers"] + accounted < pp:
        raise SpecError(f"layers ({v['layers']}) must be at least pp ({pp}){' minus the embedding/loss accounted' if accounted else ''}: "
                        "every pipeline stage needs a layer; lower --pp")
    if cp > 1 and v["seq_len"] % (2 * cp):
        raise SpecError(f"seq_len ({v['seq_len']}) must be divisible by 2*cp ({2 * cp}): context parallelism splits it into 2*cp chunks")
    order = complete_order(normalize_order(r.need("order")), cp, ep)
    dims = order.split("-")
    if ep > 1:
        if (dp * cp) % ep:
            raise SpecError(f"ep ({ep}) must divide dp*cp ({dp * cp}): experts are spread over data-parallel ranks")
        block = [d for d in dims if d in ("cp", "ep", "dp")]
        first = dims.index(block[0])
        if dims[first:first + len(block)] != block or abs(dims.index("ep") - dims.index("dp")) != 1:
            raise SpecError(f"order {order!r}: ep must sit next to dp (and cp next to them), as Megatron requires, e.g. tp-cp-ep-dp-pp")
    unchecked = bool(r.get("order_unchecked"))
    if pp > 1 and dims[-1] != "pp" and ep != cp and not unchecked:
        # Megatron builds a second (expert) rank grid with cp folded into its data-parallel
        # dimension and asserts that either pp is outermost or both grids have the same DP size
        # (core/parallel_state.py, initialize_model_parallel): ep must equal cp.
        raise SpecError(f"order {order!r} puts {dims[-1]} outside pp with cp = {cp} and ep = {ep}: Megatron refuses it "
                        "unless pp is outermost or ep = cp (parallel_state.py); use --order megatron, or "
                        "--order-unchecked to plan it anyway")
    cp_comm = r.get("cp_comm_type", "p2p")
    if cp_comm != "p2p" and cp == 1:
        raise SpecError(f"cp_comm_type {cp_comm} needs context parallelism: give --cp 2 or more, "
                        "or drop --cp-comm-type")
    if cp_comm == "a2a" and (heads // tp % cp or kv_heads // tp % cp):
        # TransformerEngine's AttnFuncWithCPAndQKVOA2A scatters heads over the CP group.
        raise SpecError(f"cp_comm_type a2a splits each TP rank's heads over cp: heads/tp ({heads // tp}) and "
                        f"kv_heads/tp ({kv_heads // tp}) must be divisible by cp ({cp}); use p2p or all-gather, or a smaller cp")
    return dict(tp=tp, cp=cp, ep=ep, pp=pp, dp=dp, world_size=world, order=order, order_unchecked=unchecked,
                cp_comm_type=cp_comm)


def tp_choices(r: Raw, v: dict, cp: int, pp: int, world: int | None) -> str:
    """What a tp refusal suggests: the tp values that pass every check a spec makes of tp (heads, KV heads, the FFN and the
    experts' FFN widths, sequence parallelism's split of the sequence, a world size given, context
    parallelism's head split): what a refusal suggests, never a value refused next."""
    widths = [v["heads"], v["kv_heads"], v["ffn_hidden"]]
    if r.get("experts"):
        widths.append(r.get("moe_ffn_hidden", v["ffn_hidden"]))
    common = math.gcd(*widths)
    ok = [t for t in range(1, common + 1) if common % t == 0]
    if r.get("sequence_parallel"):
        explicit_sp = "sequence_parallel" in r.explicit
        ok = [t for t in ok if (v["seq_len"] // cp) % t == 0 and (t > 1 or not explicit_sp)]
    elif r.get("experts"):  # Megatron's MoE token dispatcher shards tokens over TP only with SP
        ok = [1]
    if world is not None:
        ok = [t for t in ok if world % (t * cp * pp) == 0]
        batch, micro = r.get("global_batch"), r.get("micro_batch", 1)
        if batch is not None and not ("num_microbatches" in r.explicit and "global_batch" not in r.explicit):
            ok = [t for t in ok if batch % (micro * (world // (t * cp * pp))) == 0]  # dp follows tp here
    if r.get("cp_comm_type", "p2p") == "a2a":
        ok = [t for t in ok if not (v["heads"] // t % cp or v["kv_heads"] // t % cp)]
    if not ok:
        return "no tp passes every check with the other values as given (world size, batch, widths): change one of them"
    return "choose tp from {" + ", ".join(map(str, ok)) + "}"


def sizes_text(spec: Mapping[str, Any]) -> str:
    """A spec's parallel sizes as every summary gives them: tp, cp, ep, pp, dp, cp and ep only when
    above 1 (`tp=8 ep=64 pp=16 dp=128`). Generate's summary and report's header read this."""
    return " ".join(f"{d}={spec.get(d)}" for d in ("tp", "cp", "ep", "pp", "dp")
                    if d in ("tp", "pp", "dp") or (isinstance(spec.get(d), int) and spec[d] > 1))


def complete_order(order: str, cp: int, ep: int) -> str:
    """Insert a missing cp (right after tp) or ep (right before dp) of size > 1 where Megatron's
    default order tp-cp-ep-dp-pp has them; a missing dimension of size 1 needs no place."""
    dims = order.split("-")
    if cp > 1 and "cp" not in dims:
        dims.insert(dims.index("tp") + 1, "cp")
    if ep > 1 and "ep" not in dims:
        dims.insert(dims.index("dp"), "ep")
    return "-".join(dims)


def requested_order(preset: str | None, config: Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> str:
    """The order string as given (flag > config file > preset), before missing dimensions are inserted."""
    config = dict(config or {})
    given = overrides.get("order") or config.get("order")
    if given is None:
        given = get_preset(preset or config.get("preset") or "demo").get("order", "")
    return normalize_order(str(given))
