"""A kernel-time table: one row per kernel, kind, shape, dtype and its time in µs.

CSV (a header naming the columns kind, shape, dtype, us; more columns are ignored):

    kind,shape,dtype,us
    gemm,8192x4096x12288,bf16,1375.2

or JSON: {"kernels": [{"kind": "gemm", "shape": [8192, 4096, 12288], "dtype": "bf16", "us": 1375.2}]}
(other top-level keys, such as calibrate's "device", are kept as notes). A kernel given twice,
an unknown kind or dtype, a shape of the wrong length, a time that is not a positive number of
at most 10^9 µs: the file is refused with the row that is wrong.
"""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from traceforge.base.errors import SpecError
from traceforge.machine.kernels.keys import MAX_MICROS, KernelKey, check_key

COLUMNS = ("kind", "shape", "dtype", "us")


def _micros(value: Any) -> float | None:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0 < value <= MAX_MICROS else None


def _add(out: dict[KernelKey, float], where: str, kind: Any, shape: Any, dtype: Any, us: Any) -> None:
    key = check_key(kind, shape, dtype)
    if isinstance(key, str):
        raise SpecError(f"{where}: {key}")
    micros = _micros(us)
    if micros is None:
        raise SpecError(f"{where}: us must be a time in microseconds above 0 and at most {MAX_MICROS:g}, got {str(us)[:40]!r}")
    if key in out:
        raise SpecError(f"{where}: {key} is given twice: keep one time per kernel")
    out[key] = micros


def parse_csv(text: str, source: str) -> dict[KernelKey, float]:
    reader = csv.reader(io.StringIO(text))
    header = [h.strip().lower() for h in next(reader, [])]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise SpecError(f"kernel-times file {source}: the CSV header must name the columns {', '.join(COLUMNS)} "
                        f"(missing {', '.join(missing)}); see docs/kernel-times.md")
    col = {c: header.index(c) for c in COLUMNS}
    out: dict[KernelKey, float] = {}
    for line, row in enumerate(reader, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) < len(header):
            raise SpecError(f"kernel-times file {source}, line {line}: {len(row)} columns where the header has {len(header)}")
        cells = {c: row[i].strip() for c, i in col.items()}
        _add(out, f"kernel-times file {source}, line {line}", cells["kind"], cells["shape"], cells["dtype"], cells["us"])
    return out


def parse_json(doc: Any, source: str) -> dict[KernelKey, float]:
    rows = doc.get("kernels") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise SpecError(f"kernel-times file {source} must hold {{\"kernels\": [...]}} (a table) or a PyTorch profiler "
                        "trace with \"traceEvents\"; see docs/kernel-times.md")
    out: dict[KernelKey, float] = {}
    for i, row in enumerate(rows):
        where = f"kernel-times file {source}, kernels[{i}]"
        if not isinstance(row, dict):
            raise SpecError(f"{where} must be an object with kind, shape, dtype and us")
        _add(out, where, row.get("kind"), row.get("shape"), row.get("dtype"), row.get("us"))
    return out


def format_csv(times: dict[KernelKey, float]) -> str:
    """The CSV form, rows in key order (the writer of `traceforge calibrate`)."""
    lines = [",".join(COLUMNS)]
    for key in sorted(times):
        lines.append(f"{key.kind},{'x'.join(map(str, key.shape))},{key.dtype},{times[key]:.3f}")
    return "\n".join(lines) + "\n"


def format_json(times: dict[KernelKey, float], notes: dict[str, Any]) -> str:
    rows = [{"kind": k.kind, "shape": list(k.shape), "dtype": k.dtype, "us": round(times[k], 3)} for k in sorted(times)]
    return json.dumps({**notes, "kernels": rows}, indent=1) + "\n"
