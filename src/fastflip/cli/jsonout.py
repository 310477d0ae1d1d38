"""The one way CLI commands print JSON: every object carries ``schema_version`` (docs/json.md).

Layer: ``cli`` (may import every layer; imported by fastflip.__main__ only).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

__all__ = ["JSON_SCHEMA_VERSION", "dumps"]

#: Bumped when a field of any command's JSON output changes meaning or is removed (adding fields is compatible).
JSON_SCHEMA_VERSION = 1


def dumps(payload: Mapping[str, Any], indent: int | None = 2) -> str:
    """``payload`` as JSON with ``schema_version`` first.

    >>> dumps({"n": 3}, indent=None)
    '{"schema_version": 1, "n": 3}'
    """
    return json.dumps({"schema_version": JSON_SCHEMA_VERSION, **payload}, indent=indent, default=str)
