"""A run's live events (docs/api.md "Following a run live"): the server-sent events wire read
here, and what a follower keeps between connections, shared by both clients.

The gateway numbers a run's events 1, 2, 3... without a gap and gives each its number as its
`id`; a client that reconnects with `Last-Event-ID: N` gets exactly the events after `N`,
and once the run has ended and the client has them all it is answered 204. So a follower
that keeps the last id it yielded and reconnects with it after a dropped connection loses
and repeats nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from .errors import TooManyRequests, error_from_response
from .operations import segment

#: The events after which nothing follows: the run ended.
END_TYPES = frozenset({"run.completed", "run.failed", "run.cancelled"})

#: Said by the gateway to a client that read too slowly, just before it ends the stream: a
#: matter of the connection, not of the run, so a follower reconnects instead of yielding it.
_STREAM_CUT = "stream.cut"

_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Message:
    """One server-sent event as the wire carries it."""

    event: str
    data: str
    id: str | None
    """The event's own `id` field, if it had one."""
    retry_ms: int | None = None


class SseDecoder:
    """Reads the `text/event-stream` format (the WHATWG HTML standard's "Server-sent
    events") from text as it arrives, in chunks cut anywhere."""

    def __init__(self) -> None:
        self._buffer = ""
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._retry_ms: int | None = None

    def feed(self, text: str) -> list[Message]:
        """The events that `text` completes."""
        self._buffer += text
        messages = []
        while (end := _LINE_END.search(self._buffer)) is not None:
            # A chunk may end between the CR and the LF of one line break.
            if end.group() == "\r" and end.end() == len(self._buffer):
                break
            line = self._buffer[: end.start()]
            self._buffer = self._buffer[end.end() :]
            message = self._line(line)
            if message is not None:
                messages.append(message)
        return messages

    def _line(self, line: str) -> Message | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment: the gateway's heartbeat while a run waits
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry_ms = int(value)
        return None

    def _dispatch(self) -> Message | None:
        event, data, id_, retry = self._event, self._data, self._id, self._retry_ms
        self._event, self._data, self._id, self._retry_ms = "", [], None, None
        if not data:
            return None
        return Message(event or "message", "\n".join(data), id_, retry)


@dataclass(frozen=True)
class Event:
    """One event of a run: its `type` (`turn.started`, `tool.call`, `approval.requested`,
    `run.completed`, ...), its number in the run (`seq`, also its SSE id) and its JSON
    `data`, which carries `type`, `version`, `run_id` and `seq` besides what the type says."""

    type: str
    seq: int | None
    data: Mapping[str, Any] = field(repr=False)

    @property
    def ends_run(self) -> bool:
        return self.type in END_TYPES

    @classmethod
    def from_message(cls, message: Message) -> Event:
        try:
            data = json.loads(message.data)
        except ValueError:
            data = {"text": message.data}
        seq = int(message.id) if message.id is not None and message.id.isdigit() else None
        return cls(type=message.event, seq=seq, data=data if isinstance(data, dict) else {})


class StreamLost(ConnectionError):
    """The events stream kept dropping, without an event in between, past the follower's
    patience; the last error is the cause."""


class Following:
    """What following one run keeps across connections: the last event id yielded, whether
    the run's end was seen, and how long to pause before connecting again."""

    def __init__(self, run_id: str, after: int | None, *, max_failures: int = 8) -> None:
        self.path = f"/v1/runs/{segment(run_id)}/events"
        self.last_seq = after
        self.done = False
        self._decoder = SseDecoder()
        self._max_failures = max_failures
        self._failures = 0
        self._retry_ms: int | None = None
        self._retry_after: float | None = None

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self.last_seq is not None:
            headers["Last-Event-ID"] = str(self.last_seq)
        return headers

    def opened(self, response: httpx.Response) -> bool:
        """Whether `response` is a stream to read. 204 means the run ended and every event
        was had; an error the gateway may get over (429, 502 to 504) is counted as a drop,
        any other is raised. An error answer must have been read already."""
        if response.status_code == 200:
            self._decoder = SseDecoder()  # a half-read event of the last connection comes again
            return True
        if response.status_code == 204:
            self.done = True
            return False
        error = error_from_response(response)
        if response.status_code in (429, 502, 503, 504):
            if isinstance(error, TooManyRequests):
                self._retry_after = error.retry_after
            self.dropped(error)
            return False
        raise error

    def feed(self, text: str) -> list[Event]:
        """The events `text` completes, up to the run's end."""
        events = []
        for message in self._decoder.feed(text):
            if message.retry_ms is not None:
                self._retry_ms = message.retry_ms
            if message.event == _STREAM_CUT:
                continue
            event = Event.from_message(message)
            if event.seq is not None:
                self.last_seq = event.seq
            self._failures = 0
            events.append(event)
            if event.ends_run:
                self.done = True
                break
        return events

    def dropped(self, error: Exception | None) -> None:
        """The connection ended before the run did (`error`, or None for a clean close);
        raises `StreamLost` once that has happened too often without an event between."""
        self._failures += 1
        if self._failures > self._max_failures:
            raise StreamLost(
                f"the events stream of {self.path} dropped {self._failures} times in a row"
            ) from error

    def pause(self) -> float:
        """Seconds to wait before connecting again: what the gateway asked for, else a
        backoff that grows with the drops in a row, from a quarter of a second to five."""
        if self._retry_after is not None:
            pause, self._retry_after = self._retry_after, None
            return pause
        if self._retry_ms is not None:
            return self._retry_ms / 1000
        return min(0.25 * 2.0 ** max(self._failures - 1, 0), 5.0)
