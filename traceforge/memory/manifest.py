"""The memory report of a trace set we wrote: its manifest holds the whole spec."""

from __future__ import annotations

from typing import Any

from traceforge.base.errors import UserError
from traceforge.config import FIELD_BY_NAME, Spec, build_spec
from traceforge.memory.report import MemoryReport, memory_report


def manifest_spec(manifest: dict | None) -> Spec | None:
    """The spec a manifest records, rebuilt and validated as generate built it; None for sets
    without one (foreign traces). A spec that no longer validates raises UserError."""
    doc: Any = (manifest or {}).get("spec")
    if not isinstance(doc, dict):
        return None
    fields = {k: v for k, v in doc.items() if k in FIELD_BY_NAME and v is not None}
    preset = doc.get("preset") if isinstance(doc.get("preset"), str) else None
    try:
        return build_spec(preset, None, fields)
    except UserError:
        return build_spec(None, None, fields)  # a preset this version does not know: every value is explicit


def manifest_memory(manifest: dict | None) -> tuple[MemoryReport | None, str | None]:
    """(report, None), or (None, why not) for a set whose spec is missing or unusable."""
    try:
        spec = manifest_spec(manifest)
        if spec is None:
            return None, None
        return memory_report(spec), None
    except UserError as exc:
        return None, f"memory not shown: the manifest's spec does not build ({exc})"
