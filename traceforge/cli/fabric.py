"""The fabric flags (--fabric, --fabric-leaf, ..., --pxn) of `report` and `generate`, defined once:
same names, help and meaning (docs/fabric.md), read into one traceforge.machine.fabric.Fabric."""

from __future__ import annotations

import inspect
from typing import Any

import typer

from traceforge.base.errors import UserError

PANEL = "Fabric"
FABRIC_HELP = ("Route the step onto a fabric's links and show bytes per tier and dimension, the hottest links and ECMP "
               "collisions: a .yaml/.toml/.json description, a named fabric (dgx-h100-superpod, meta-24k-roce, "
               "rail-only-dgx-h100) or a wiring (rail-optimized, rail-only, tor, multi-plane: 64-port leaves and spines). "
               "docs/fabric.md.")
GENERATE_FABRIC_HELP = ("Shape every ASTRA-sim bundle (analytical, ns-3, htsim) from a fabric: a .yaml/.toml/.json "
                        "description, a named fabric (dgx-h100-superpod, meta-24k-roce, rail-only-dgx-h100) or a wiring "
                        "(rail-optimized, rail-only, tor, multi-plane). docs/fabric.md, docs/simulators.md.")
TIER_HELP = ("The {} switch tier: RADIX, or radix=64,gbps=50,over=7,down=192,latency=600 (ports, GB/s per link, "
             "oversubscription down:up = k:1, ports down, ns).")

# parameter name -> (flag(s), annotation, help, the Fabric/with_flags key it sets)
_FLAGS: dict[str, tuple[tuple[str, ...], Any, str, str]] = {
    "fabric_leaf": (("--fabric-leaf",), str, TIER_HELP.format("first (leaf)"), "leaf"),
    "fabric_spine": (("--fabric-spine",), str, TIER_HELP.format("second (spine)") + " 'none': no spine.", "spine"),
    "fabric_core": (("--fabric-core",), str, TIER_HELP.format("third (core)") + " 'none': no core.", "core"),
    "fabric_placement": (("--fabric-placement",), str, "The fabric node slot of each of the job's nodes, in order: "
                         "'contiguous' (0, 1, ...; default) or a list such as 0-15,48-63 (a scheduler's allocation).",
                         "placement"),
    "nvlink_domain": (("--nvlink-domain",), int, "GPUs per NVLink domain (8 on HGX, 72 on NVL72); a multiple of "
                      "--gpus-per-node. Default: one node.", "nvlink_domain"),
    "fabric_wiring": (("--fabric-wiring",), str, "How NICs reach the leaves: rail-optimized, rail-only, tor or "
                      "multi-plane.", "wiring"),
    "fabric_planes": (("--fabric-planes",), int, "Planes of a multi-plane fabric (default 2).", "planes"),
    "fabric_seed": (("--fabric-seed",), int, "Seed of the ECMP hash (default 0).", "seed"),
    "fabric_qps": (("--fabric-qps",), int, "Queue pairs per connection, each a flow of its own "
                   "(NCCL_IB_QPS_PER_CONNECTION; default 1).", "qps_per_connection"),
    "pxn": (("--pxn/--no-pxn",), bool, "NCCL's PXN: a transfer to another rail crosses NVLink to the sender node's GPU "
            "on that rail first (default on; rail-only wiring always does).", "pxn"),
}
NAMES = ("fabric", *_FLAGS)


def fabric_parameters(fabric_help: str = FABRIC_HELP) -> list[inspect.Parameter]:
    """Keyword parameters (default None: not given) for --fabric and every fabric flag."""
    params = [inspect.Parameter("fabric", inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                                default=typer.Option(None, "--fabric", help=fabric_help, rich_help_panel=PANEL))]
    for name, (decls, kind, help_text, _) in _FLAGS.items():
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=kind | None,
                                        default=typer.Option(None, *decls, help=help_text, rich_help_panel=PANEL)))
    return params


def fabric_from_options(options: dict[str, Any], given: dict[str, Any], **extra: Any):
    """--fabric and the fabric flags (popped from options) as one Fabric, None without --fabric;
    -g and --nics-per-node, when given (`given`: the machine flags the user gave), are the
    fabric's node too. `extra`: a command's own fabric flags by their with_flags key (report's
    fail, degrade). A fabric flag without --fabric is refused in one line."""
    value = options.pop("fabric", None)
    flags = {_FLAGS[name][3]: options.pop(name, None) for name in _FLAGS}
    if value is None:
        given_flag = next((_spelling(name, flags[key]) for name, (_, _, _, key) in _FLAGS.items()
                           if flags[key] is not None), None)
        given_flag = given_flag or next((f"--{key}" for key, v in extra.items() if v is not None), None)
        if given_flag:
            raise UserError(f"{given_flag} describes a fabric: add --fabric (a file, a named fabric or a wiring such as "
                            "rail-optimized)")
        return None
    from traceforge.machine.fabric import load_fabric, with_flags

    node = {k: given[k] for k in ("gpus_per_node", "nics_per_node") if k in given}
    return with_flags(load_fabric(value), **node, **flags, **extra)


def _spelling(name: str, value: Any) -> str:
    """The flag as the user typed it: --pxn/--no-pxn by its value."""
    on, _, off = _FLAGS[name][0][0].partition("/")
    return off if value is False and off else on
