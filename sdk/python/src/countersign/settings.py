"""What both clients are configured with, and the timeouts each request gets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from .operations import Operation
from .version import VERSION

#: How long the events stream may be silent before the connection is taken as dead: the
#: gateway sends a heartbeat comment every 15 s while a run waits, so three missed ones.
STREAM_SILENCE_SECS = 45.0


@dataclass(frozen=True)
class Settings:
    base_url: str
    api_key: str
    timeout: float
    poll_secs: int

    def __post_init__(self) -> None:
        if self.poll_secs < 1:
            raise ValueError("poll_secs must be at least 1")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))

    def headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.api_key}",
            "User-Agent": f"countersign-python/{VERSION}",
        }

    def timeout_for(self, operation: Operation[Any]) -> float:
        """The request's own timeout plus however long the gateway may hold it on purpose."""
        return self.timeout + operation.waits

    def stream_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, read=max(self.timeout, STREAM_SILENCE_SECS))
