"""Spec files: a flat mapping of spec keys read from YAML, TOML or JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from traceforge.base.errors import SpecError
from traceforge.base.files import MAX_SPEC_FILE_BYTES, input_file_problem, read_regular_file
from traceforge.config.build import check_keys


class _DuplicateKey(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """json object_pairs_hook: a key given twice is an error, not a silent last-wins."""
    out: dict[Any, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} is given twice")
        out[key] = value
    return out


def _yaml_load(text: str) -> Any:
    """yaml.safe_load without aliases (a flat spec needs none; an alias bomb would expand without
    end) and without duplicate keys."""
    import yaml

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise _DuplicateKey(f"line {mark.line + 1}: YAML aliases (*name) are not allowed in a spec file")
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
            keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
            seen: set[Any] = set()
            for key, (knode, _) in zip(keys, node.value, strict=True):
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: let the base class report it
                    continue
                if dup:
                    raise _DuplicateKey(f"line {knode.start_mark.line + 1}: key {key!r} is given twice")
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass


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
    data_bytes = read_regular_file(path, "config file", MAX_SPEC_FILE_BYTES, fix, SpecError)
    try:
        text = data_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"config file {path} is not UTF-8 text: save it as a UTF-8 .yaml, .toml or .json file") from None
    try:
        if suffix in (".yaml", ".yml"):
            data = _yaml_load(text)
        elif suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            data = tomllib.loads(text)
        else:
            data = json.loads(text, object_pairs_hook=_unique_pairs)
    except Exception as exc:  # the parsers' own error types differ; all mean malformed input
        detail = " ".join(str(exc).split())[:300]  # bounded: a message may quote the input
        raise SpecError(f"config file {path} is not valid {suffix.lstrip('.').upper()}: {detail}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"config file {path} must hold a mapping of spec keys (e.g. 'tp: 2'), not a {type(data).__name__}")
    check_keys(f"config file {path}", data)  # here, where the file's name is known
    return data
