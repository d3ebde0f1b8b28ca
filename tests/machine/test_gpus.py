"""The GPU table (traceforge/machine/gpus.py) is the one owner of every per-GPU fact: no other
module of the package holds a table keyed by GPU names, every record states every fact, and the
readers (--gpu's choices, the memory, NCCL's generation and DGX node, the messages' lists) read
the records."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from traceforge.base.errors import SpecError
from traceforge.config import FIELDS, build_spec
from traceforge.machine import nccl
from traceforge.machine.gpu_memory import gpu_memory_bytes
from traceforge.machine.gpus import ARCHITECTURES, GPUS, AttentionRates, Calibration, Fp8, Gpu, gpu_names

PACKAGE = Path(__file__).resolve().parents[2] / "traceforge"
OWNER = PACKAGE / "machine" / "gpus.py"


def gpu_tables(source: str, names: set[str]) -> list[int]:
    """Lines of the dict, set, tuple or list literals holding two or more of `names` as strings
    (a table keyed by, or a list of, GPU names)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            items = [*node.keys, *node.values]
        elif isinstance(node, (ast.Set, ast.Tuple, ast.List)):
            items = list(node.elts)
        else:
            continue
        named = [i for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value in names]
        if len(named) >= 2:
            found.append(node.lineno)
    return found


def test_the_detector_finds_a_table_keyed_by_gpu_names():
    names = {"a100", "h100"}
    assert gpu_tables('X = {"a100": 1, "h100": 2}', names) == [1]
    assert gpu_tables('Y = ("x",\n "a100", "h100")', names) == [1]
    assert gpu_tables('if g in {"h100", "a100"}: pass', names) == [1]
    assert gpu_tables('Z = {"a100": 1}\nW = (*GPUS, "custom")', names) == []


def test_no_module_but_the_gpu_table_holds_a_table_of_gpus():
    names = set(GPUS)
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}"
                 for path in sorted(PACKAGE.rglob("*.py")) if path != OWNER
                 for line in gpu_tables(path.read_text(encoding="utf-8"), names)]
    assert offenders == []


def test_every_record_states_every_fact():
    # No fact has a default: a record that leaves one out does not construct.
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               for f in dataclasses.fields(Gpu))
    dtypes = set(next(f for f in FIELDS if f.name == "dtype").choices)
    for name, g in GPUS.items():
        assert g.name == name
        assert g.architecture in ARCHITECTURES and g.architecture in nccl.GENERATIONS
        assert set(g.peak_tflops) == dtypes and all(v > 0 for v in g.peak_tflops.values())
        assert g.hbm_gbps > 0 and g.memory_mib > 0 and g.nvlink_gbps > 0 and g.dgx_nic_gbps > 0
        assert isinstance(g.calibration, Calibration)
        assert g.fp8 is None or isinstance(g.fp8, Fp8)
        assert g.flash1 is None or isinstance(g.flash1, AttentionRates)
    assert set(ARCHITECTURES) == set(nccl.GENERATIONS)


def test_gpu_choices_are_the_table():
    choices = next(f for f in FIELDS if f.name == "gpu").choices
    assert choices == (*GPUS, "custom")


def test_readers_take_the_records():
    # nvidia-smi's H100 SXM5 total, 81,559 MiB
    assert gpu_memory_bytes("h100") == 81559 * 2**20
    with pytest.raises(SpecError, match="memory of GPU 'custom' is unknown"):
        gpu_memory_bytes("custom")
    # the DGX node NCCL's model defaults to: 8 GPUs at the NVLink line rate, 8 NICs
    assert nccl.DGX["h100"] == nccl.NcclMachine("hopper", 8, 450.0, 8, 50.0)
    assert nccl.DGX["a100"] == nccl.NcclMachine("ampere", 8, 300.0, 8, 25.0)
    assert nccl.NcclMachine.for_gpu("b200").generation == "blackwell"
    # FlashAttention-1's generation on A100: half FlashAttention-2's 0.60 / 0.50 of peak
    a100 = GPUS["a100"].flash1
    assert a100 is not None and (a100.fwd, a100.bwd) == pytest.approx((0.30, 0.25))


def test_lists_run_oldest_architecture_first():
    assert gpu_names() == ("a100", "h100", "h200", "b200")
    assert gpu_names("fp8") == ("h100", "h200", "b200")  # A100 has no FP8 tensor cores
    assert gpu_names("flash1") == ("a100", "h100", "h200")  # nothing published on Blackwell
    with pytest.raises(SpecError, match=r"FP8 tensor cores \(h100, h200, b200\); a100 has none"):
        build_spec("demo", overrides={"gpu": "a100", "fp8": "hybrid"})
