"""A plan's answer as plain rows: the --json document, the table, plan.csv and shard files all
read these, so a merged sharded plan prints exactly what one run prints."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from traceforge.config import FIELD_BY_NAME
from traceforge.search.candidates import Base, PlanResult, Ranked, sort_key

# The --json candidate keys: fixed, for the scripts that read them (docs/plan.md lists them).
JSON_KEYS = ("tp", "pp", "dp", "cp", "ep", "vp", "micro_batch", "num_microbatches", "schedule", "recompute",
             "dp_mode", "step_ms", "tflops_per_gpu", "mfu", "peak_bytes", "allocated_bytes", "reserved_bytes", "verdict",
             "flags")


def _flag(name: str, value: Any) -> str:
    field = FIELD_BY_NAME[name]
    if field.kind is bool:
        on, off = field.bool_flags or ("--" + name.replace("_", "-"), "--no-" + name.replace("_", "-"))
        return on if value else off
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    return f"--{name.replace('_', '-')} {shlex.quote(str(value))}"


def generate_flags(base: Base, values: Mapping[str, Any]) -> str:
    """The `traceforge generate` flags that reproduce a candidate: the user's preset, spec file
    and flags, then every value the search chose (world_size stands for dp); quoted for a shell
    (a path with a space stays one word)."""
    parts = [f"-p {base.preset}"] if base.preset else []
    if base.config_path:
        parts.append(f"-c {shlex.quote(base.config_path)}")
    chosen = {k: v for k, v in values.items() if k != "dp" and v is not None}
    merged = {**{k: v for k, v in base.overrides.items() if v is not None and k not in chosen}, **chosen}
    parts += [_flag(k, v) for k, v in merged.items()]
    return " ".join(parts)


def row(base: Base, r: Ranked, gpu_memory: int, run_flags: str = "") -> dict[str, Any]:
    """run_flags: generate flags that are not spec values but decide whether it writes the
    candidate (--gpu-memory-gb: its memory gate must pass what plan called feasible)."""
    s, e = r.spec, r.estimate
    return {
        "tp": s.tp, "pp": s.pp, "dp": s.dp, "cp": s.cp, "ep": s.ep, "vp": s.virtual_stages,
        "micro_batch": s.micro_batch, "num_microbatches": s.num_microbatches, "schedule": s.schedule,
        "recompute": s.recompute, "dp_mode": s.dp_mode, "step_ms": round(r.step_ms, 3),
        "tflops_per_gpu": round(r.tflops_per_gpu, 2), "mfu": round(r.mfu, 4), "peak_bytes": r.peak_bytes,
        "allocated_bytes": r.memory.allocated, "reserved_bytes": r.memory.reserved, "verdict": r.memory.verdict,
        "flags": " ".join(filter(None, (generate_flags(base, r.values), run_flags))),
        # beyond the --json keys: the table's and plan.csv's columns, and what --write-top rebuilds
        "shard_size": s.shard_size, "layer_split": "embedding+loss" if s.account_for_embedding_in_pipeline_split else "even",
        "tokens_per_s": round(r.tokens_per_s, 1), "compute_ms": round(e.compute_us / 1e3, 3),
        "exposed_ms": {d: round(v / 1e3, 3) for d, v in e.exposed_us.items()}, "bubble_ms": round(e.idle_us / 1e3, 3),
        "headroom_bytes": gpu_memory - r.peak_bytes if gpu_memory else None, "bound_ms": round(r.bound_us / 1e3, 3),
        "values": {k: v for k, v in sorted(r.values.items())},
    }


def rows(base: Base, result: PlanResult, run_flags: str = "") -> list[dict[str, Any]]:
    return [row(base, r, result.gpu_memory_bytes, run_flags) for r in result.candidates]


def rank_rows(all_rows: list[dict[str, Any]], top: int | None) -> list[dict[str, Any]]:
    """Rows in rank order (step, then a fixed order of their values), the first top of them."""
    ordered = sorted(all_rows, key=lambda r: (r["step_ms"], sort_key(r["values"])))
    return ordered if top is None else ordered[:top]


def json_document(gpus: int, counts: Mapping[str, Any], ranked: list[dict[str, Any]]) -> dict[str, Any]:
    """The --json document: the counts, the proof of how far from exact it is (search/proof.py:
    exact, floor_ms, proven_gap, ... in docs/plan.md), the candidates."""
    return {"gpus": gpus, "considered": counts["considered"], "legal": counts["legal"], "feasible": counts["feasible"],
            "seconds": round(counts["seconds"], 3), **counts["proof"].document(),
            "candidates": [{k: r[k] for k in JSON_KEYS} for r in ranked]}


def family(r: Mapping[str, Any]) -> str:
    """A layout family for the plot: the parallel sizes."""
    return f"t{r['tp']} c{r['cp']} p{r['pp']} e{r['ep']}"
