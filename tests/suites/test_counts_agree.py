"""One count for each thing the commands count, computed by one owner, the same in every command:
the groups of each kind (generate's summary, manifest.json, comm_group.json, report), the parallel
sizes (generate's summary, report's header: ep too), and the point-to-point pairs (the traffic
table's pairs, the test matrix's Send rows).

Before: deepseek-v3's summary said `edp 1024` where comm_group.json and report had 960 (a stage
of dense layers names no expert-DP group), report's header dropped ep, and the test matrix
counted 192 directed pp pairs where the traffic table said 96."""

from __future__ import annotations

import json
import re

import pytest
from cli_runner import invoke

# A DeepSeek-like model small enough to write: the first stage's two layers are dense, so that
# stage names no ep or edp group.
SMALL_DEEPSEEK = ["-p", "deepseek-v3", "--layers", "4", "--moe-first-dense-layers", "2", "--pp", "2", "--dp", "8",
                  "--ep", "4", "--experts", "8", "--top-k", "2", "--moe-router-num-groups", "1",
                  "--moe-router-group-topk", "1", "--hidden", "1024", "--heads", "8", "--kv-heads", "8",
                  "--q-lora-rank", "64", "--kv-lora-rank", "32", "--qk-nope-head-dim", "32", "--qk-rope-head-dim", "16",
                  "--v-head-dim", "32", "--ffn-hidden", "2048", "--moe-ffn-hidden", "512", "--vocab", "1024",
                  "--seq-len", "256", "--global-batch", "16", "--recompute", "none"]


@pytest.mark.parametrize("flags", [SMALL_DEEPSEEK, ["--tp", "2", "--pp", "2", "--dp", "8", "--global-batch", "32"]],
                         ids=["deepseek-like", "demo-32"])
def test_every_command_gives_the_same_counts(tmp_path, monkeypatch, flags):
    monkeypatch.chdir(tmp_path)
    done = invoke("generate", *flags, "-o", "set")
    assert done.exit_code == 0, done.stderr
    summary = dict(re.findall(r"(\w+) (\d+)", done.stdout.split("groups: ")[1].splitlines()[0]))
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    assert {k: int(v) for k, v in summary.items()} == manifest["groups"]
    # comm_group.json holds exactly the groups the manifest counts
    assert len(json.loads((tmp_path / "set" / "comm_group.json").read_text())) == sum(manifest["groups"].values())
    doc = json.loads(invoke("report", "set", "--no-timeline", "--json", "-q").stdout)
    by_dim = {d["dim"]: d for d in doc["dimensions"]}
    for kind, count in manifest["groups"].items():
        if kind in by_dim:  # report counts the groups the files name, per dimension
            assert by_dim[kind]["groups"] == count, kind
    # the sizes: generate's summary and report's header say the same, ep included
    sizes = re.search(r": (tp=\d+(?: \w+=\d+)*)", done.stdout).group(1)
    header = invoke("report", "set", "--no-timeline", "-q").stdout.splitlines()[0]
    assert f": {sizes}," in header, (sizes, header)
    if manifest["spec"]["ep"] > 1:
        assert f"ep={manifest['spec']['ep']}" in header
    # point-to-point pairs: the traffic table's count is the test matrix's
    sends = [r for r in doc["test_matrix"] if r["dim"] == "pp" and r["collective"] == "Send"]
    pairs = {tuple(sorted(m)) for r in sends for m in r["memberships"]}
    assert len(pairs) == by_dim["pp"]["groups"]
    assert all(r["groups"] == len(r["memberships"]) == len({tuple(sorted(m)) for m in r["memberships"]}) for r in sends)
