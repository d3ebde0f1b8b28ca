"""A refusal that suggests values suggests only values that pass every check: `--tp 3` on
llama3-70b suggested {1, 2, 4, 8, 16, 32, 64} (the divisors of its 64 heads), and 16 and up were
then refused for its 8 KV heads."""

from __future__ import annotations

import re

import pytest

from traceforge.config import SpecError, build_spec

CASES = [
    ("llama3-70b", {"tp": 3}),
    ("llama3-70b", {"tp": 16}),
    ("llama3-70b", {"tp": 3, "world_size": 1536, "global_batch": 1536}),
    ("mixtral-8x7b", {"tp": 3}),
    ("qwen3-235b-a22b", {"tp": 3}),
    ("demo", {"tp": 3, "sequence_parallel": True, "seq_len": 520}),
    ("llama3-8b", {"tp": 6, "cp": 2, "cp_comm_type": "a2a", "order": "megatron"}),
]


@pytest.mark.parametrize(("preset", "flags"), CASES)
def test_every_suggested_tp_builds(preset, flags):
    with pytest.raises(SpecError) as refused:
        build_spec(preset, overrides=flags)
    found = re.search(r"choose tp from \{([0-9, ]+)\}", str(refused.value))
    assert found, str(refused.value)
    values = [int(v) for v in found.group(1).split(", ")]
    assert values
    for tp in values:
        build_spec(preset, overrides={**flags, "tp": tp})  # every suggestion passes every check


def test_llama3_70b_tp_3_suggests_what_its_kv_heads_allow():
    with pytest.raises(SpecError, match=r"choose tp from \{1, 2, 4, 8\}$"):
        build_spec("llama3-70b", overrides={"tp": 3})


def test_no_suggestion_when_no_tp_fits_the_rest():
    """A world of 96 with llama3-70b's pp 4 and batch 128 leaves no tp (dp = 96/(4 tp) never
    divides 128): the refusal says so rather than offering a value refused next."""
    with pytest.raises(SpecError, match="no tp passes every check"):
        build_spec("llama3-70b", overrides={"tp": 3, "world_size": 96})


def test_a_renamed_preset_works_under_its_old_name_with_a_note(tmp_path):
    """llama3-405b-128k read as a 128K context; it is 131,072 GPUs at 8,192 tokens a sequence."""
    from cli_runner import invoke

    from traceforge.config.presets import PRESETS

    assert "llama3-405b-131072gpu" in PRESETS and "llama3-405b-128k" not in PRESETS
    assert build_spec("llama3-405b-128k") == build_spec("llama3-405b-131072gpu")
    assert build_spec("llama3-405b-128k").preset == "llama3-405b-131072gpu"
    done = invoke("memory", "-p", "llama3-405b-128k", "--json")
    assert done.exit_code == 0
    assert done.stderr.strip().splitlines() == ["note: preset llama3-405b-128k was renamed llama3-405b-131072gpu; "
                                                "the old name still works"]
    assert invoke("memory", "-p", "llama3-405b-131072gpu", "--json").stderr == ""
