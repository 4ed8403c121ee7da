"""Every request the clients make, built here once for both: an `Operation` says what to send
and how to read the answer, and `Client` and `AsyncClient` only send it. Nothing here does
any I/O.

Work that takes several requests (waiting on a call, claiming and reporting an execution) is
written once too, as a `Flow`: a generator that yields the operations it needs and is sent
their answers (or thrown their errors). `drive` and `drive_async` run a flow over a sync or
an async client.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from .calls import Call
from .errors import CountersignError, error_from_response
from .runs import Decided, DecisionRequest, PendingPage, Run, RunState

T = TypeVar("T")

#: How long the gateway holds an ask, or a look at a call, that does not say how long it
#: may wait for the call's outcome (docs/door.md "Asking").
DEFAULT_WAIT_SECS = 10


@dataclass(frozen=True)
class Evidence:
    """A result the agent had seen before it asked, shown to reviewers beside the call."""

    tool: str
    content: str
    input: Any = None
    is_error: bool = False

    def to_json(self) -> dict[str, Any]:
        seen: dict[str, Any] = {"tool": self.tool, "content": self.content}
        if self.input is not None:
            seen["input"] = self.input
        if self.is_error:
            seen["is_error"] = True
        return seen


@dataclass(frozen=True)
class Operation(Generic[T]):
    """One request and how to read its answer."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, str | int] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    waits: float = 0
    """How long the gateway may hold the answer on purpose (a long poll), on top of the
    client's own timeout."""


def answer(parse: Callable[[Any], T]) -> Callable[[httpx.Response], T]:
    """Reads a JSON answer with `parse`, or raises the error it is."""

    def read(response: httpx.Response) -> T:
        if response.status_code >= 400:
            raise error_from_response(response)
        return parse(response.json())

    return read


def segment(value: str) -> str:
    """A path segment, escaped: ids and names are not trusted to be URL-safe."""
    return quote(value, safe="")


def start_run(
    agent: str,
    input: str,
    *,
    idempotency_key: str,
    requested_by: str | None,
    metadata: Mapping[str, Any] | None,
) -> Operation[RunState]:
    body: dict[str, Any] = {"agent": agent, "input": input}
    if requested_by is not None:
        body["requested_by"] = requested_by
    if metadata is not None:
        body["metadata"] = dict(metadata)
    return Operation(
        "POST",
        "/v1/runs",
        answer(RunState.from_json),
        json=body,
        headers={"Idempotency-Key": idempotency_key},
    )


def get_run(run_id: str) -> Operation[Run]:
    return Operation("GET", f"/v1/runs/{segment(run_id)}", answer(Run.from_json))


def cancel_run(run_id: str, reason: str | None) -> Operation[RunState]:
    body = {"reason": reason} if reason is not None else {}
    return Operation(
        "POST", f"/v1/runs/{segment(run_id)}/cancel", answer(RunState.from_json), json=body
    )


def pending(limit: int | None, cursor: str | None) -> Operation[PendingPage]:
    params: dict[str, str | int] = {"status": "pending"}
    if limit is not None:
        params["limit"] = limit
    if cursor is not None:
        params["cursor"] = cursor
    return Operation("GET", "/v1/approvals", answer(PendingPage.from_json), params=params)


def decide(
    run_id: str, decisions: Sequence[DecisionRequest], decided_by: str | None
) -> Operation[Decided]:
    body: dict[str, Any] = {"decisions": [d.to_json() for d in decisions]}
    if decided_by is not None:
        body["decided_by"] = decided_by
    return Operation(
        "POST", f"/v1/runs/{segment(run_id)}/decisions", answer(Decided.from_json), json=body
    )


def ask(
    agent: str,
    tool: str,
    input: Any,
    *,
    idempotency_key: str,
    task: str | None,
    message: str,
    evidence: Sequence[Evidence | Mapping[str, Any]],
    session: str | None,
    requested_by: str | None,
    wait_secs: int | None,
) -> Operation[Call]:
    body: dict[str, Any] = {"tool": tool, "input": input}
    optional = {
        "task": task,
        "message": message or None,
        "evidence": [e.to_json() if isinstance(e, Evidence) else dict(e) for e in evidence] or None,
        "session": session,
        "requested_by": requested_by,
        "wait_secs": wait_secs,
    }
    body.update({name: value for name, value in optional.items() if value is not None})
    return Operation(
        "POST",
        f"/v1/agents/{segment(agent)}/calls",
        answer(Call.from_json),
        json=body,
        headers={"Idempotency-Key": idempotency_key},
        waits=wait_secs if wait_secs is not None else DEFAULT_WAIT_SECS,
    )


def get_call(run_id: str, call_id: str, wait_secs: int | None) -> Operation[Call]:
    params: dict[str, str | int] | None = None
    if wait_secs is not None:
        params = {"wait_secs": wait_secs}
    return Operation(
        "GET",
        f"/v1/runs/{segment(run_id)}/calls/{segment(call_id)}",
        answer(Call.from_json),
        params=params,
        waits=wait_secs if wait_secs is not None else DEFAULT_WAIT_SECS,
    )


def report_execution(call: Call, report: Mapping[str, Any]) -> Operation[Call]:
    return Operation(
        "POST",
        f"/v1/runs/{segment(call.run_id)}/calls/{segment(call.call_id)}/execution",
        answer(Call.from_json),
        json=dict(report),
    )


# A flow yields operations, is sent each one's answer (or thrown its CountersignError), and
# returns its result.
Flow = Generator[Operation[Any], Any, T]


def waiting(
    call: Call,
    timeout: float | None,
    poll_secs: int,
    clock: Callable[[], float] = time.monotonic,
) -> Flow[Call]:
    """Looks at `call` again, each look a long poll of at most `poll_secs`, until it has an
    outcome or `timeout` seconds have passed (None: until it has one); returns its latest
    view, which has no outcome if the time ran out first."""
    deadline = None if timeout is None else clock() + timeout
    while not call.outcome_reached:
        secs = poll_secs
        if deadline is not None:
            left = deadline - clock()
            if left <= 0:
                break
            secs = min(poll_secs, math.ceil(left))
        call = yield get_call(call.run_id, call.call_id, secs)
    return call


def drive(flow: Flow[T], send: Callable[[Operation[Any]], Any]) -> T:
    """Runs `flow`, sending each operation with the sync `send`."""
    try:
        operation = next(flow)
        while True:
            try:
                answered = send(operation)
            except CountersignError as error:
                operation = flow.throw(error)
            else:
                operation = flow.send(answered)
    except StopIteration as done:
        result: T = done.value
        return result


async def drive_async(flow: Flow[T], send: Callable[[Operation[Any]], Awaitable[Any]]) -> T:
    """Runs `flow`, sending each operation with the async `send`."""
    try:
        operation = next(flow)
        while True:
            try:
                answered = await send(operation)
            except CountersignError as error:
                operation = flow.throw(error)
            else:
                operation = flow.send(answered)
    except StopIteration as done:
        result: T = done.value
        return result
