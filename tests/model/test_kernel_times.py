"""--kernel-times and `traceforge calibrate`: measured kernel times replace the compute model per
kernel, from a table or from a PyTorch profiler (Kineto) trace of one step, and nothing else.

The synthetic profile below is built by hand: operators with the input shapes a real
record_shapes=True trace carries, CUDA runtime launches and the kernels they correlate with, and
kernel durations we choose, so what the import must find is known exactly.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
from collections import Counter

import pytest
from cli_runner import invoke, one_line_error

from traceforge.base.errors import SpecError
from traceforge.config import build_spec
from traceforge.machine.kernels.keys import KernelKey
from traceforge.machine.kernels.kineto import read_profile
from traceforge.machine.kernels.times import load_kernel_times

BF16 = "c10::BFloat16"


class Profile:
    """A Chrome trace as torch.profiler writes it: cpu_op, cuda_runtime and kernel events."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.now, self.corr = 0.0, 0

    def op(self, name: str, dims: list, kernels: list[tuple[str, float]], tid: int = 1, parent: str | None = None,
           parent_dims: list | None = None, types: str = BF16) -> None:
        """One operator call launching ``kernels`` (name, µs), optionally inside a parent operator."""
        start = self.now
        self.now += 1
        inner_start = self.now
        for kname, dur in kernels:
            self.corr += 1
            self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": tid,
                                "ts": self.now, "dur": 1, "args": {"correlation": self.corr}})
            self.events.append({"ph": "X", "cat": "kernel", "name": kname, "pid": 0, "tid": 7, "ts": 1e6 + self.now,
                                "dur": dur, "args": {"correlation": self.corr, "stream": 7}})
            self.now += 2
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 9, "tid": tid, "ts": inner_start,
                            "dur": self.now - inner_start, "args": {"Input Dims": dims, "Input type": [types] * len(dims)}})
        if parent:
            self.events.append({"ph": "X", "cat": "cpu_op", "name": parent, "pid": 9, "tid": tid, "ts": start,
                                "dur": self.now + 1 - start, "args": {"Input Dims": parent_dims or [], "Input type": [types]}})
        self.now += 3

    def write(self, path, gz: bool = False) -> str:
        data = json.dumps({"schemaVersion": 1, "traceEvents": self.events}).encode()
        (path.write_bytes(gzip.compress(data)) if gz else path.write_bytes(data))
        return str(path)


# -- tables ---------------------------------------------------------------------------------------

def test_csv_and_json_tables_read_the_same(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("kind,shape,dtype,us,note\ngemm,512x512x768,bf16,12.5,qkv\n\nlayernorm,262144,bf16,3,\n"
                   "attention_fwd,1x4x512x512x64x64,bf16,40.25,\n")
    js = tmp_path / "t.json"
    js.write_text(json.dumps({"device": "x", "kernels": [
        {"kind": "gemm", "shape": [512, 512, 768], "dtype": "bf16", "us": 12.5},
        {"kind": "layernorm", "shape": "262144", "dtype": "bf16", "us": 3},
        {"kind": "attention_fwd", "shape": [1, 4, 512, 512, 64, 64], "dtype": "bf16", "us": 40.25}]}))
    a, b = load_kernel_times(str(csv)), load_kernel_times(str(js))
    assert a.times == b.times == {
        KernelKey("gemm", (512, 512, 768), "bf16"): 12.5,
        KernelKey("layernorm", (262144,), "bf16"): 3.0,
        KernelKey("attention_fwd", (1, 4, 512, 512, 64, 64), "bf16"): 40.25}
    assert a.source == b.source == "table"


@pytest.mark.parametrize("body, words", [
    ("kind,shape,us\ngemm,1x2x3,1\n", ["header", "dtype"]),
    ("kind,shape,dtype,us\nconv,1x2x3,bf16,1\n", ["line 2", "conv"]),
    ("kind,shape,dtype,us\ngemm,1x2,bf16,1\n", ["line 2", "3 numbers"]),
    ("kind,shape,dtype,us\ngemm,1x2x-3,bf16,1\n", ["line 2", "shape"]),
    ("kind,shape,dtype,us\ngemm,1x2x3,int4,1\n", ["line 2", "int4"]),
    ("kind,shape,dtype,us\ngemm,1x2x3,bf16,nan\n", ["line 2", "us"]),
    ("kind,shape,dtype,us\ngemm,1x2x3,bf16,-4\n", ["line 2", "us"]),
    ("kind,shape,dtype,us\ngemm,1x2x3,bf16,1e300\n", ["line 2", "us"]),
    ("kind,shape,dtype,us\ngemm,1x2x3,bf16,1\ngemm,1x2x3,bf16,2\n", ["line 3", "twice"]),
    ("kind,shape,dtype,us\ngemm,1x2x3\n", ["line 2", "columns"]),
])
def test_bad_csv_rows_are_named(tmp_path, body, words):
    path = tmp_path / "t.csv"
    path.write_text(body)
    with pytest.raises(SpecError) as err:
        load_kernel_times(str(path))
    for word in words:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize("doc, word", [
    ([1, 2], "kernels"),
    ({"kernels": {"a": 1}}, "kernels"),
    ({"kernels": [7]}, "kernels[0]"),
    ({"kernels": [{"kind": "gemm", "shape": [1, 2, True], "dtype": "bf16", "us": 1}]}, "shape"),
    ({"kernels": [{"kind": "gemm", "shape": [1, 2, 2**41], "dtype": "bf16", "us": 1}]}, "shape"),
    ({"kernels": [{"kind": "gemm", "shape": [1, 2, 3], "dtype": "bf16", "us": "fast"}]}, "us"),
    ({"traceEvents": {}}, "traceEvents"),
    ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]}, "kernel"),
    ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]}, "cpu_op"),
])
def test_bad_json_is_refused(tmp_path, doc, word):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError) as err:
        load_kernel_times(str(path))
    assert word in str(err.value)


@pytest.mark.parametrize("kind", ["fifo", "dir", "missing", "huge", "gzip-bomb", "not-gzip", "binary", "deep"])
def test_hostile_files_get_one_line(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    name = "k.json"
    if kind == "fifo":
        os.mkfifo(name)
    elif kind == "dir":
        os.mkdir(name)
    elif kind == "huge":
        monkeypatch.setattr("traceforge.machine.kernels.times.MAX_KERNEL_FILE_BYTES", 1000)
        (tmp_path / name).write_text(json.dumps({"kernels": []}) + " " * 2000)
    elif kind == "gzip-bomb":
        monkeypatch.setattr("traceforge.machine.kernels.times.MAX_KERNEL_FILE_BYTES", 10_000)
        (tmp_path / name).write_bytes(gzip.compress(b" " * 1_000_000))
    elif kind == "not-gzip":
        (tmp_path / name).write_bytes(b"\x1f\x8b" + b"\x00" * 40)
    elif kind == "binary":
        (tmp_path / name).write_bytes(b"\xff\xfe\x00garbage")
    elif kind == "deep":
        (tmp_path / name).write_text("[" * 100_000 + "]" * 100_000)
    result = invoke("generate", "-o", tmp_path / "out", "--kernel-times", name)
    one_line_error(result, "kernel-times file")
    assert not (tmp_path / "out").exists()


# -- the profile import ---------------------------------------------------------------------------

def test_profile_kernels_are_attributed_by_operator_and_shape(tmp_path):
    p = Profile()
    # Forward linear -> addmm (one GEMM kernel + a split-K reduction, summed), three layers.
    for us in (30.0, 34.0, 31.0):
        p.op("aten::addmm", [[1536], [2048, 512], [512, 1536]], [("sm90_gemm", us), ("splitk_reduce", 2.0)],
             parent="aten::linear", parent_dims=[[4, 512, 512], [1536, 512], [1536]])
    # Input gradient on the autograd thread: mm (2048 x 1536) @ (1536 x 512).
    p.op("aten::mm", [[2048, 1536], [1536, 512]], [("sm90_gemm", 50.0)], tid=2, parent="autograd::engine::evaluate_function: MmBackward0")
    # FlashAttention through SDPA (b, h, s, d), forward and backward.
    p.op("aten::_scaled_dot_product_flash_attention", [[4, 8, 512, 64], [4, 8, 512, 64], [4, 8, 512, 64]],
         [("flash_fwd_kernel", 80.0)], parent="aten::scaled_dot_product_attention")
    p.op("aten::_scaled_dot_product_flash_attention_backward", [[4, 8, 512, 64]] * 4, [("flash_bwd_kernel", 200.0)], tid=2)
    p.op("aten::native_layer_norm", [[4, 512, 512], [512], [512]], [("vectorized_layer_norm_kernel", 6.0)])
    # Not ours: NCCL, an unknown fused kernel, a GEMM in fp64.
    p.op("c10d::allreduce_", [[1024]], [("ncclDevKernel_AllReduce", 500.0)])
    p.op("my::fused_thing", [[10]], [("fused_kernel", 7.0)])
    p.op("aten::mm", [[2, 2], [2, 2]], [("dgemm", 1.0)], types="double")
    prof = read_profile({"traceEvents": p.events}, "p.json")
    assert prof.times == {
        KernelKey("gemm", (2048, 512, 1536), "bf16"): statistics.median([32.0, 36.0, 33.0]),
        KernelKey("gemm", (2048, 1536, 512), "bf16"): 50.0,
        KernelKey("attention_fwd", (4, 8, 512, 512, 64, 64), "bf16"): 80.0,
        KernelKey("attention_bwd", (4, 8, 512, 512, 64, 64), "bf16"): 200.0,
        KernelKey("layernorm", (4 * 512 * 512,), "bf16"): 6.0,
    }
    assert prof.calls[KernelKey("gemm", (2048, 512, 1536), "bf16")] == 3
    total = 3 * 2 + 30 + 34 + 31 + 50 + 80 + 200 + 6 + 500 + 7 + 1
    assert prof.kernels == 13 and prof.kernel_us == total
    assert prof.attributed_us == total - 500 - 7 - 1
    assert set(prof.unattributed) == {"ncclDevKernel_AllReduce", "fused_kernel", "aten::mm"}


def test_profile_by_external_id_and_gzip(tmp_path):
    """Without runtime events, a kernel's External id names its operator; .json.gz reads the same."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
         "args": {"Input Dims": [[64, 32], [32, 16]], "Input type": [BF16, BF16], "External id": 42}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 100, "dur": 9.5, "args": {"External id": 42}},
    ]
    path = tmp_path / "p.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    times = load_kernel_times(str(path))
    assert times.source == "profile"
    assert times.times == {KernelKey("gemm", (64, 32, 16), "bf16"): 9.5}


def test_profile_without_shapes_is_refused(tmp_path):
    p = Profile()
    p.op("aten::mm", [], [("gemm", 3.0)])
    path = p.write(tmp_path / "p.json")
    one_line_error(invoke("generate", "-o", tmp_path / "out", "--kernel-times", path), "record_shapes")


def test_spec_records_the_file_by_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("kind,shape,dtype,us\ngemm,1x2x3,bf16,1\n")
    spec = build_spec("demo", overrides={"kernel_times": "t.csv"})
    assert spec.kernel_times == str(tmp_path / "t.csv")


# -- the compute model takes them ---------------------------------------------------------------

def _table(path, times: dict[KernelKey, float]) -> str:
    path.write_text("kind,shape,dtype,us\n" + "".join(f"{k.kind},{'x'.join(map(str, k.shape))},{k.dtype},{us}\n"
                                                       for k, us in times.items()))
    return str(path)


# demo on rank 0 (gpt, b 1, s 512, h 512, ffn 2048, 8 heads, tp 2, no SP): the kernels by hand.
T, H, TP = 512, 512, 2
QKV, PROJ, FC1, FC2 = (T, H, 3 * H // TP), (T, H // TP, H), (T, H, 4 * H // TP), (T, 4 * H // TP, H)
ATTN = (1, 8 // TP, 512, 512, 64, 64)


def _dgrad(shape):
    t, k, n = shape
    return (t, n, k)


def _wgrad(shape):
    t, k, n = shape
    return (k, t, n)


def test_measured_kernels_replace_the_model_and_only_them(tmp_path):
    from traceforge.model.compute import CostModel

    bf = "bf16"
    given = {KernelKey("gemm", QKV, bf): 100.0, KernelKey("gemm", PROJ, bf): 50.0,
             KernelKey("attention_fwd", ATTN, bf): 200.0, KernelKey("bias_dropout_add", (T * H,), bf): 7.0,
             KernelKey("gemm", (1, 2, 3), bf): 1.0}  # a kernel demo never runs: unused
    spec = build_spec("demo", overrides={"kernel_times": _table(tmp_path / "t.csv", given)})
    measured, model = CostModel(spec), CostModel(build_spec("demo"))
    assert measured.kernels.keys() == model.kernels.keys()
    for k, cost in measured.kernels.items():
        key = KernelKey(k.kind, k.shape, k.dtype)
        assert cost.micros == given.get(key, model.kernels[k].micros), key
        assert (cost.flops, cost.bytes) == (model.kernels[k].flops, model.kernels[k].bytes)
    layernorm = model.kernels[next(k for k in model.kernels if k.kind == "layernorm")].micros
    assert measured.attn_fwd.micros == pytest.approx(7.0 + layernorm + 100.0 + 200.0 + 50.0, abs=1e-9)


def test_trace_durations_are_the_table_sums(make_set, tmp_path):
    """Every kernel demo's first stage runs, at whole µs: each compute node lasts exactly the sum of
    its kernels (a layer's kernels as Megatron runs them; docs/simulation.md)."""
    bf = "bf16"
    us = {"gemm": 10, "attention_fwd": 30, "attention_bwd": 70, "bias_dropout_add": 3, "layernorm": 2,
          "bias_gelu": 4, "bias_gelu_bwd": 5, "layernorm_bwd": 6, "bias_dropout_add_bwd": 1, "embedding": 8,
          "embedding_bwd": 9}
    keys = [KernelKey("gemm", s, bf) for shape in (QKV, PROJ, FC1, FC2) for s in (shape, _dgrad(shape), _wgrad(shape))]
    keys += [KernelKey("attention_fwd", ATTN, bf), KernelKey("attention_bwd", ATTN, bf)]
    keys += [KernelKey(kind, (T * H * (2 if kind.startswith("bias_gelu") else 1),), bf)
             for kind in us if kind not in ("gemm", "attention_fwd", "attention_bwd")]
    # the word embedding's dense gradient (demo: V = 1,024): zeroed, then added to the fp32 main grad
    us |= {"zero_fill": 11, "grad_accumulate": 12}
    keys += [KernelKey("zero_fill", (1024 // TP * H,), bf), KernelKey("grad_accumulate", (1024 // TP * H,), "fp32")]
    path = _table(tmp_path / "t.json.csv", {k: float(us[k.kind]) for k in keys})
    spec, out, doc = make_set("demo", kernel_times=path)
    norm, norm_bwd = us["bias_dropout_add"] + us["layernorm"], us["layernorm_bwd"] + us["bias_dropout_add_bwd"]
    expect = {
        "embed": us["embedding"],
        "attn": norm + 10 + us["attention_fwd"] + 10,
        "mlp": norm + 10 + us["bias_gelu"] + 10,
        "mlp_dgrad": 10 + us["bias_gelu_bwd"] + 10 + norm_bwd,
        "mlp_wgrad": 20,
        "attn_dgrad": 10 + us["attention_bwd"] + 10 + norm_bwd,
        "attn_wgrad": 20,
        "embed_wgrad": us["zero_fill"] + us["embedding_bwd"] + us["grad_accumulate"],
    }
    from oracle import COMP, load_set
    seen = Counter()
    for n in load_set(out).nodes[0]:
        what = n.name.split("/")[-1]
        if n.type == COMP and what in expect:
            assert n.duration == expect[what], (n.name, n.duration)
            seen[what] += 1
    assert set(seen) == set(expect)
    matched = {m["kernel"] for m in doc["kernel_times"]["matched"]}
    assert matched == {str(k) for k in keys if k.kind not in ("embedding", "embedding_bwd")} | {
        str(KernelKey("embedding", (T * H,), bf)), str(KernelKey("embedding_bwd", (T * H,), bf))}
    # The last stage's LM head and cross-entropy were not in the table: modelled.
    assert {m["kernel"].split()[0] for m in doc["kernel_times"]["modelled"]} == {"gemm", "cross_entropy", "cross_entropy_bwd"}


def test_profile_import_end_to_end(tmp_path):
    """A synthetic step profile holding two of demo's kernels: those two are measured (the median
    of their calls), every other kernel keeps the model's time, and generate says so."""
    from traceforge.model.compute import CostModel

    p = Profile()
    for us in (90.0, 95.0, 120.0):  # qkv forward, three layers
        p.op("aten::addmm", [[768], [T, H], [H, 768]], [("sm90_xmma_gemm", us)],
             parent="aten::linear", parent_dims=[[1, T, H], [768, H], [768]])
    p.op("aten::_scaled_dot_product_flash_attention", [[1, 4, 512, 64]] * 3, [("flash_fwd_kernel", 210.0)])
    p.op("nccl:all_reduce", [[T, H]], [("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 400.0)])
    path = p.write(tmp_path / "step.pt.trace.json")
    result = invoke("generate", "-o", tmp_path / "out", "--kernel-times", path)
    assert result.exit_code == 0, result.stderr
    assert "2 of 23 kernels measured" in result.stdout
    assert "ncclDevKernel_AllReduce" in result.stdout  # the largest kernel left out
    doc = json.loads((tmp_path / "out" / "manifest.json").read_text())["kernel_times"]
    assert doc["source"] == "profile" and doc["unused"] == 0
    assert {m["kernel"]: m["us"] for m in doc["matched"]} == {"gemm 512x512x768 bf16": 95.0,
                                                              "attention_fwd 1x4x512x512x64x64 bf16": 210.0}
    assert len(doc["modelled"]) == 21
    assert doc["profile"]["kernel_us"] == 90 + 95 + 120 + 210 + 400 and doc["profile"]["attributed_us"] == 515
    measured, model = CostModel(build_spec("demo", overrides={"kernel_times": path})), CostModel(build_spec("demo"))
    for k, cost in measured.kernels.items():
        want = {("gemm", (T, H, 768)): 95.0, ("attention_fwd", ATTN): 210.0}.get((k.kind, k.shape), model.kernels[k].micros)
        assert cost.micros == want


# -- calibrate ------------------------------------------------------------------------------------

def test_calibrate_measures_what_the_spec_prices(tmp_path):
    from traceforge.cli.calibrate import write_table
    from traceforge.model.calibrate import MEASURED_KINDS, needed_kernels

    spec = build_spec("llama3-8b", overrides={"layers": 2, "tp": 2, "pp": 1, "dp": 1, "world_size": 2, "global_batch": 1,
                                              "seq_len": 1024})
    keys = needed_kernels(spec)
    timed: list[KernelKey] = []

    def fake(key: KernelKey) -> float:
        timed.append(key)
        return 1.0 + sum(key.shape) % 997 / 8  # any positive time, one per shape

    for name in ("cal.csv", "cal.json"):
        write_table(tmp_path / name, spec, keys, fake, "FakeGPU", quiet=True)
        table = load_kernel_times.__wrapped__(str(tmp_path / name))
        assert table.times == {k: pytest.approx(fake(k), abs=1e-3) for k in keys if k.kind in MEASURED_KINDS}
    left = {"embedding", "embedding_bwd", "cross_entropy", "cross_entropy_bwd", "zero_fill", "grad_accumulate"}
    assert {k.kind for k in keys} - set(MEASURED_KINDS) == left
    assert len(set(timed)) == len({k for k in keys if k.kind in MEASURED_KINDS})
    # The written table feeds generate: every measured kernel matched, only the unmeasured modelled.
    result = invoke("generate", "-o", tmp_path / "out", "-p", "llama3-8b", "--layers", 2, "--tp", 2, "--pp", 1, "--dp", 1,
                    "--world-size", 2, "--global-batch", 1, "--seq-len", 1024, "--kernel-times", tmp_path / "cal.json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads((tmp_path / "out" / "manifest.json").read_text())["kernel_times"]
    assert len(doc["matched"]) == len(table.times)
    assert {m["kernel"].split()[0] for m in doc["modelled"]} == left


def test_calibrate_without_torch_or_cuda_says_so(tmp_path, monkeypatch):
    import sys
    import types

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    one_line_error(invoke("calibrate", "-o", tmp_path / "t.csv"), "PyTorch", "traceforge[calibrate]")
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake)
    one_line_error(invoke("calibrate", "-o", tmp_path / "t.csv"), "CUDA")
    one_line_error(invoke("calibrate", "-o", tmp_path / "t.txt"), ".csv or .json")
    assert not list(tmp_path.iterdir())


def test_calibrate_replaces_only_a_table(tmp_path, monkeypatch):
    from traceforge.cli import calibrate as cli

    monkeypatch.setattr("traceforge.model.calibrate.torch_timer", lambda spec, w, r: (lambda key: 2.0, "FakeGPU"))
    path = tmp_path / "t.csv"
    path.write_text("my notes, not a table\n")
    one_line_error(invoke("calibrate", "-o", path), "did not write")
    assert path.read_text() == "my notes, not a table\n"
    path.write_text("kind,shape,dtype,us\ngemm,1x2x3,bf16,1\n")
    result = invoke("calibrate", "-o", path)
    assert result.exit_code == 0, result.stderr
    assert "FakeGPU" in result.stdout
    assert len(load_kernel_times.__wrapped__(str(path)).times) > 10
    assert cli.MAX_REPEAT > 0
