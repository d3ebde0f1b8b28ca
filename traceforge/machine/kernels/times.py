"""Load a --kernel-times file (a table or a profiler trace) once, and say what it covered."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from traceforge.base.errors import SpecError
from traceforge.base.files import read_regular_file
from traceforge.machine.kernels.keys import KernelKey
from traceforge.machine.kernels.kineto import Profile, read_profile
from traceforge.machine.kernels.table import parse_csv, parse_json

FIX = "give a kernel-time table (.csv or .json) or a PyTorch profiler trace (.json, .json.gz); see docs/kernel-times.md"
# A one-step profile with shapes is tens to a few hundred MB; parsing JSON costs ~10x its size in memory.
MAX_KERNEL_FILE_BYTES = 512 << 20


@dataclass(frozen=True)
class KernelTimes:
    path: str
    sha256: str
    source: str  # "table" or "profile"
    times: dict[KernelKey, float]
    profile: Profile | None = None

    def micros(self, key: KernelKey) -> float | None:
        return self.times.get(key)

    def coverage(self, needed: list[KernelKey], modelled: dict[KernelKey, float]) -> dict[str, Any]:
        """What the compute model took from the file and what it kept (for the summary and the
        manifest): per kernel the measured and the modelled µs."""
        matched = [k for k in needed if k in self.times]
        doc: dict[str, Any] = {
            "file": self.path, "sha256": self.sha256, "source": self.source,
            "matched": [{"kernel": str(k), "us": round(self.times[k], 3), "model_us": round(modelled[k], 3)} for k in matched],
            "modelled": [{"kernel": str(k), "model_us": round(modelled[k], 3)} for k in needed if k not in self.times],
            "unused": len(self.times) - len(set(matched)),
        }
        if self.profile is not None:
            doc["profile"] = self.profile.summary()
        return doc


def _decode(data: bytes, path: Path) -> bytes:
    if data[:2] != b"\x1f\x8b":
        return data
    try:  # bounded: a small .gz may expand without end
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            out = f.read(MAX_KERNEL_FILE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise SpecError(f"kernel-times file {path} is not a readable gzip file ({exc}): {FIX}") from None
    if len(out) > MAX_KERNEL_FILE_BYTES:
        raise SpecError(f"kernel-times file {path} expands to more than {MAX_KERNEL_FILE_BYTES:,} bytes: {FIX}")
    return out


@cache
def load_kernel_times(path: str) -> KernelTimes:
    """The file at ``path`` (absolute), parsed once per process."""
    where = Path(path)
    raw = read_regular_file(where, "kernel-times file", MAX_KERNEL_FILE_BYTES, FIX, SpecError)
    sha = hashlib.sha256(raw).hexdigest()
    data = _decode(raw, where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"kernel-times file {where} is not UTF-8 text: {FIX}") from None
    name = where.name.lower()
    if name.endswith(".csv"):
        return KernelTimes(path, sha, "table", parse_csv(text, str(where)))
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        detail = " ".join(str(exc).split())[:200]
        raise SpecError(f"kernel-times file {where} is neither CSV (by its .csv name) nor valid JSON ({detail}): {FIX}") from None
    if isinstance(doc, dict) and "traceEvents" in doc:
        profile = read_profile(doc, str(where))
        if not profile.times:
            raise SpecError(f"kernel-times file {where}: no kernel could be matched to a GEMM, attention, norm or activation "
                            "with its shapes; profile with record_shapes=True (docs/kernel-times.md)")
        return KernelTimes(path, sha, "profile", profile.times, profile)
    return KernelTimes(path, sha, "table", parse_json(doc, str(where)))


def summary_lines(doc: dict[str, Any], shown: int = 4) -> list[str]:
    """generate's summary of a manifest's ``kernel_times``."""
    matched, modelled = doc["matched"], doc["modelled"]
    line = (f"  kernel times from {Path(doc['file']).name} ({doc['source']}): {len(matched)} of "
            f"{len(matched) + len(modelled)} kernels measured")
    if modelled:
        names = ", ".join(m["kernel"] for m in modelled[:shown])
        line += f"; modelled: {names}" + (f" and {len(modelled) - shown} more" if len(modelled) > shown else "")
    lines = [line]
    profile = doc.get("profile")
    if profile:
        share = profile["attributed_us"] / profile["kernel_us"] * 100 if profile["kernel_us"] else 0.0
        top = ", ".join(u["name"][:40] for u in profile["unattributed_top"][:3])
        lines.append(f"    profile: {profile['kernels']:,} kernels, {share:.1f} % of their GPU time attributed"
                     + (f"; largest left out: {top}" if top else ""))
    return lines
