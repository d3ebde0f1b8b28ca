#!/usr/bin/env python3
"""Regenerate the committed sample trace sets: samples/<name>/traces from samples/<name>/spec.yaml.

    python scripts/regen_samples.py            # every sample
    python scripts/regen_samples.py zero3 demo # some of them

Run it when the output format or the planner changes on purpose; tests/suites/test_samples.py
regenerates each sample the same way and requires identical bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from traceforge.config import build_spec, load_config_file
from traceforge.write.writer import write_trace_set

SAMPLES_DIR = Path(__file__).resolve().parent.parent / "samples"
SPEC_FILE = "spec.yaml"
TRACES_DIR = "traces"


def sample_dirs(root: Path | None = None) -> list[Path]:
    """Every folder of root (default: the repository's samples/) that holds a spec file, by name."""
    return sorted(p.parent for p in (root or SAMPLES_DIR).glob(f"*/{SPEC_FILE}"))


def generate(sample: Path, out: Path, force: bool = False) -> dict:
    """Write the trace set of one sample's spec into out; return its manifest."""
    spec = build_spec(None, load_config_file(sample / SPEC_FILE))
    return write_trace_set(spec, out, force=force, jobs=1)


def main(names: list[str], root: Path | None = None) -> int:
    samples = sample_dirs(root)
    if names:
        by_name = {s.name: s for s in samples}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            print(f"regen_samples: no sample {', '.join(unknown)}; samples: {', '.join(by_name)}", file=sys.stderr)
            return 2
        samples = [by_name[n] for n in names]
    for sample in samples:
        doc = generate(sample, sample / TRACES_DIR, force=True)
        totals = doc["totals"]
        print(f"{sample.name}: {doc['world_size']} ranks, {totals['nodes']} nodes, {totals['bytes'] / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
