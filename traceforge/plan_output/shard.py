"""`plan --shard K/N` and `plan --merge`: the search's layouts split over N jobs of any runner.

Shard K replays the top K of its own share (every N-th layout), exactly: the global top K is
among the shards' top Ks, so merging their rows and ranking again gives the unsharded answer.
Each shard writes DIR/plan-shard-K-of-N.json; merge checks every shard of one query is there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from traceforge.base.errors import UserError
from traceforge.base.files import Fields, read_json
from traceforge.search.proof import BUDGET, SHARD_KEYS, TIMEOUT

SHARD_FILE = re.compile(r"^plan-shard-(?P<k>[0-9]+)-of-(?P<n>[0-9]+)\.json$", re.ASCII)
FORMAT = "traceforge plan shard 2"  # 2: each shard's proof (search/proof.py), which a merge combines


def shard_file_name(k: int, n: int) -> str:
    return f"plan-shard-{k}-of-{n}.json"


def shard_document(k: int, n: int, query: Mapping[str, Any], counts: Mapping[str, Any], rows: list[dict[str, Any]]) -> str:
    doc = {"format": FORMAT, "shard": [k, n], "query": query, **counts, "rows": rows}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


# Every row field merge, the table, plan.csv and --write-top use, with its kind (files.Fields).
_ROW_COUNTS = ("tp", "pp", "dp", "cp", "ep", "vp", "micro_batch", "num_microbatches")
_ROW_TIMES = ("step_ms", "tflops_per_gpu", "mfu", "tokens_per_s", "compute_ms", "bubble_ms", "bound_ms")
_ROW_TEXT = ("schedule", "recompute", "dp_mode", "flags", "layer_split", "verdict")


def _check_rows(rows: list, path: Path) -> None:
    """A forged or damaged row is one line naming the file and the field, never a KeyError later."""
    f = Fields(path, "rerun that shard")
    for i, row in enumerate(rows):
        row = f.mapping(row, f"rows[{i}]")
        for key in _ROW_COUNTS:
            f.whole(row.get(key), f"rows[{i}].{key}", 1)
        for key in ("peak_bytes", "allocated_bytes", "reserved_bytes"):
            f.whole(row.get(key), f"rows[{i}].{key}")
        for key in _ROW_TIMES:
            f.number(row.get(key), f"rows[{i}].{key}", 0.0, 1e18)
        for key in _ROW_TEXT:
            f.text(row.get(key), f"rows[{i}].{key}")
        for dim, ms in f.mapping(row.get("exposed_ms"), f"rows[{i}].exposed_ms").items():
            f.number(ms, f"rows[{i}].exposed_ms.{dim}", 0.0, 1e18)
        f.mapping(row.get("values"), f"rows[{i}].values")


def _check_proof(proof: object, path: Path) -> dict[str, Any]:
    """A shard's proof (Proof.shard()), every key checked: a forged one is one line, never a KeyError."""
    f = Fields(path, "rerun that shard")
    doc = f.mapping(proof, "proof")
    for key in SHARD_KEYS:
        value = doc.get(key)
        if key in ("best_ms", "floor_ms", "kth_ms", "timeout_s"):
            if value is not None:
                f.number(value, f"proof.{key}", 0.0, 1e18)
        elif key == "stopped_by":
            if value not in (None, BUDGET, TIMEOUT):
                f.fail(f"proof.{key}", value, f"null, {BUDGET!r} or {TIMEOUT!r}")
        elif value is not None or key not in ("limit", "budget"):
            f.whole(value, f"proof.{key}", 1 if key == "limit" else 0)
    return doc


def _read(path: Path) -> dict[str, Any]:
    doc = read_json(path, "plan shard file", "rerun that shard")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("rows"), list):
        raise UserError(f"{path} is not a plan shard file of this traceforge version: rerun that shard")
    for key in ("considered", "legal", "feasible", "seconds"):
        if not isinstance(doc.get(key), (int, float)) or isinstance(doc.get(key), bool) or doc[key] < 0:
            raise UserError(f"{path}: {key} is not a count: rerun that shard")
    _check_rows(doc["rows"], path)
    _check_proof(doc.get("proof"), path)
    return doc


def merge_shards(directory: Path) -> tuple[Mapping[str, Any], dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(query, summed counts, every shard's rows, every shard's proof) of a complete set of shard files."""
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"{directory} is not a directory: give the folder the 'plan --shard K/N -o DIR' runs wrote into")
    found: dict[int, dict[int, Path]] = {}
    for path in sorted(directory.iterdir()):
        m = SHARD_FILE.match(path.name)
        if m:
            found.setdefault(int(m["n"]), {})[int(m["k"])] = path
    if not found:
        raise UserError(f"{directory} holds no plan-shard-K-of-N.json: run 'traceforge plan ... --shard K/N -o {directory}' first")
    if len(found) > 1:
        raise UserError(f"{directory} holds shards of different splits ({', '.join(f'N={n}' for n in sorted(found))}): "
                        "keep one run's shards")
    (n, shards), = found.items()
    missing = [k for k in range(n) if k not in shards]
    if missing:
        raise UserError(f"{directory}: shard {missing[0]}/{n} is missing ({len(missing)} of {n}): run it, then merge again")
    docs = [_read(shards[k]) for k in range(n)]
    query = docs[0]["query"]
    for k, doc in enumerate(docs):
        if doc["query"] != query or doc["shard"] != [k, n]:
            raise UserError(f"{shards[k]} belongs to another plan (its query or shard number differs): "
                            "rerun it with the same flags")
    counts: dict[str, Any] = {key: sum(d[key] for d in docs) for key in ("considered", "legal", "feasible", "seconds")}
    rows = [r for d in docs for r in d["rows"]]
    return query, counts, rows, [d["proof"] for d in docs]
