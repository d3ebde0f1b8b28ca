"""Spec files: a flat mapping of spec keys read from YAML, TOML or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceforge.base.errors import SpecError
from traceforge.base.files import input_file_problem, read_structured
from traceforge.config.build import check_keys


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a flat spec mapping from YAML, TOML or JSON, chosen by the file's extension."""
    path = Path(path)
    fix = "give the path of a .yaml, .toml or .json spec"
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml", ".json"):
        problem = input_file_problem(path)
        if problem:
            raise SpecError(f"config file {path} {problem}: {fix}")
        raise SpecError(f"config file {path}: unknown extension {suffix!r}; use .yaml, .yml, .toml or .json")
    data = read_structured(path, "config file", "spec file", fix, SpecError)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"config file {path} must hold a mapping of spec keys (e.g. 'tp: 2'), not a {type(data).__name__}")
    check_keys(f"config file {path}", data)  # here, where the file's name is known
    return data
