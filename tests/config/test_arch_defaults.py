"""An architecture's defaults come from the architecture a spec names, never from the preset under
it, and every summary, manifest and report says where each default came from."""

from __future__ import annotations

import json

import pytest
from cli_runner import invoke

from traceforge.config import arch_values, build_spec, preset_values, spec_defaults, spec_label
from traceforge.config.architecture import ARCH_DEFAULTS
from traceforge.config.presets import PRESETS

LLAMA = dict(arch="llama", layers=2, hidden=512, heads=8, kv_heads=2, vocab=1024, seq_len=256)


def test_a_llama_spec_over_the_demo_preset_has_untied_embeddings():
    spec = build_spec(None, LLAMA)  # no preset: the demo's values fill what the spec lacks
    assert spec.preset == "demo" and PRESETS["demo"]["tied_embeddings"] is True
    assert spec.tied_embeddings is False  # Llama's, not the GPT demo's
    assert spec_defaults(spec.to_dict()) == {"tied_embeddings": "arch llama"}
    assert spec_label(spec.to_dict()) == "custom llama over demo"
    assert arch_values(spec, LLAMA) == {"tied_embeddings": False}
    assert "tied_embeddings" not in preset_values(spec, LLAMA)


def test_a_gpt_spec_over_a_llama_preset_ties_them_and_a_given_value_wins():
    assert build_spec("llama3-8b", {"arch": "gpt"}).tied_embeddings is True
    assert build_spec(None, {**LLAMA, "tied_embeddings": True}).tied_embeddings is True
    assert build_spec("llama3-8b", {"arch": "gpt", "tied_embeddings": False}).tied_embeddings is False


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_agrees_with_its_architecture(name):
    """A preset's own architecture defaults are the architecture's, so naming the preset's own
    architecture changes nothing, and no preset's spec is labelled or annotated otherwise."""
    preset = PRESETS[name]
    for key, value in ARCH_DEFAULTS[preset["arch"]].items():
        assert preset[key] == value, (name, key)
    spec = build_spec(name)
    assert build_spec(name, {"arch": preset["arch"]}) == spec
    assert spec_defaults(spec.to_dict()) == {} and spec_label(spec.to_dict()) == name


def test_the_manifest_the_summary_and_the_report_say_where_the_default_came_from(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama.json").write_text(json.dumps({**LLAMA, "global_batch": 8}))
    done = invoke("generate", "-c", "llama.json", "-o", "set")
    assert done.exit_code == 0, done.stderr
    assert "custom llama over demo:" in done.stdout
    assert "from arch llama: tied_embeddings=False" in done.stdout
    assert "tied_embeddings" not in done.stdout.split("from preset demo:")[1].split("\n")[0]
    manifest = json.loads((tmp_path / "set" / "manifest.json").read_text())
    assert manifest["defaults"] == {"tied_embeddings": "arch llama"}
    assert manifest["spec"]["tied_embeddings"] is False and "emb" not in manifest["groups"]
    report = invoke("report", "set", "--no-timeline")
    assert report.exit_code == 0, report.stderr
    assert "custom llama over demo: tp=2" in report.stdout and "\n│ emb " not in report.stdout
    doc = json.loads(invoke("report", "set", "--no-timeline", "--json").stdout)
    assert doc["source"]["spec"]["defaults"] == {"tied_embeddings": "arch llama"}
    # A preset's own set carries no such key: the preset's name says where every default came from.
    assert invoke("generate", "-q", "-o", "demo").exit_code == 0
    assert "defaults" not in json.loads((tmp_path / "demo" / "manifest.json").read_text())
