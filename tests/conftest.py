import json

import pytest
from oracle import assert_sound

from traceforge.config import build_spec
from traceforge.write.writer import write_trace_set


@pytest.fixture
def make_set(tmp_path):
    """Write a trace set for preset + overrides into a fresh directory; return (spec, dir, manifest)."""
    counter = {"n": 0}

    def make(preset: str = "demo", **overrides):
        counter["n"] += 1
        spec = build_spec(preset, overrides=overrides)
        out = tmp_path / f"set{counter['n']}"
        write_trace_set(spec, out, jobs=1)
        # Every set a test makes must be consistent across ranks (collectives matched per
        # group, Send/Recv paired) and run to completion; checked by the independent oracle.
        assert_sound(out)
        doc = json.loads((out / "manifest.json").read_text())
        return spec, out, doc

    return make
