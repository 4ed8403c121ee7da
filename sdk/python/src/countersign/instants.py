"""Instants as the API writes them: RFC 3339 text in the door's and runs' answers, or
milliseconds since the epoch in the approvals listing."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def instant(value: Any) -> datetime | None:
    """The instant `value` names, in UTC; None for none. Python 3.10's `fromisoformat` does
    not read a trailing `Z`, so it is spelled as an offset first."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"not an instant: {value!r}")
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value / 1000, tz=timezone.utc)
    text = str(value)
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)
