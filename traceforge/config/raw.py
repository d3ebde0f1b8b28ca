"""The merged raw values each domain's check reads, and the small helpers the checks share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceforge.base.errors import SpecError


class Raw:
    """The merged raw values, with 'need' for required ones."""

    def __init__(self, raw: dict[str, Any], explicit: Mapping[str, Any]):
        self.raw, self.explicit = raw, explicit

    def get(self, name: str, default: Any = None) -> Any:
        value = self.raw.get(name)
        return default if value is None else value

    def need(self, name: str) -> Any:
        if self.raw.get(name) is None:
            raise SpecError(f"{name} is not set: give --{name.replace('_', '-')} or set it in the config file")
        return self.raw[name]


def divisors(n: int) -> str:
    return "{" + ", ".join(str(k) for k in range(1, n + 1) if n % k == 0) + "}"
