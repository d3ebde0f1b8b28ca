"""The committed samples are regression fixtures: regenerating each gives identical bytes.

When a change to the format or the planner is intended, run `python scripts/regen_samples.py`.
"""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import yaml

from traceforge.read.reader import attrs, iter_nodes

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
REGEN_HINT = "the sample no longer matches the planner's output; if that change is intended, run: python scripts/regen_samples.py"


def _load_regen():
    spec = importlib.util.spec_from_file_location("regen_samples", ROOT / "scripts" / "regen_samples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


regen = _load_regen()
SAMPLE_NAMES = [p.name for p in regen.sample_dirs()]


def spec_of(name: str) -> dict:
    return yaml.safe_load((SAMPLES / name / regen.SPEC_FILE).read_text())


def committed(name: str) -> Path:
    return SAMPLES / name / regen.TRACES_DIR


def without_version(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "version"}


def test_the_issue_samples_exist():
    assert {"demo", "demo-megatron", "zero3", "sequence-parallel", "pipeline-1f1b", "pipeline-gpipe"} <= set(SAMPLE_NAMES)
    for name in SAMPLE_NAMES:
        assert (committed(name) / "manifest.json").is_file(), f"{name}: run python scripts/regen_samples.py"


def test_samples_are_what_they_claim():
    # The README's 8-GPU case under both orders: GPU0's DP partner is 4 (tp-pp-dp) or 2 (Megatron).
    for name, partner in (("demo", 4), ("demo-megatron", 2)):
        doc = json.loads((committed(name) / "manifest.json").read_text())
        assert (doc["spec"]["tp"], doc["spec"]["pp"], doc["spec"]["dp"]) == (2, 2, 2)
        groups = json.loads((committed(name) / "comm_group.json").read_text())
        dp_groups = {a["pg_name"] for a in map(attrs, iter_nodes(committed(name) / "workload.0.et"))
                     if a.get("dim") == "dp" and "pg_name" in a}
        assert [groups[g] for g in dp_groups] == [[0, partner]]
    assert spec_of("zero3")["dp_mode"] == "zero3"
    assert spec_of("sequence-parallel")["sequence_parallel"] is True
    # The pipeline pair differs only in the schedule.
    a, b = spec_of("pipeline-1f1b"), spec_of("pipeline-gpipe")
    assert (a.pop("schedule"), b.pop("schedule")) == ("1f1b", "gpipe") and a == b
    assert a["pp"] > 2


def test_samples_stay_small():
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file())
    assert total < 2_000_000


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_regenerates_identically(name, tmp_path):
    out = tmp_path / name
    regen.generate(SAMPLES / name, out)
    fixture = committed(name)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in fixture.iterdir()), REGEN_HINT
    for path in sorted(out.iterdir()):
        if path.name == "manifest.json":
            fresh, old = json.loads(path.read_text()), json.loads((fixture / path.name).read_text())
            assert without_version(fresh) == without_version(old), REGEN_HINT
        else:
            assert path.read_bytes() == (fixture / path.name).read_bytes(), f"{name}/{path.name}: {REGEN_HINT}"


def test_regen_script_rebuilds_every_sample_folder(tmp_path, capsys):
    # Run the script's entry point on a copy of two specs; it writes <sample>/traces for each.
    for name in ("demo", "pipeline-gpipe"):
        (tmp_path / name).mkdir()
        shutil.copy(SAMPLES / name / regen.SPEC_FILE, tmp_path / name / regen.SPEC_FILE)
    assert regen.main([], root=tmp_path) == 0
    for name in ("demo", "pipeline-gpipe"):
        for path in committed(name).glob("*.et"):
            assert (tmp_path / name / regen.TRACES_DIR / path.name).read_bytes() == path.read_bytes()
    assert regen.main(["no-such-sample"], root=tmp_path) == 2
