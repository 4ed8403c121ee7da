"""`Client`: the gateway's API over a blocking httpx client. Requests are built and answers
read in `operations` (shared with `AsyncClient`); this module only sends them."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from . import operations
from .calls import Call
from .events import Event, Following
from .execution import Attempt, logged_if_failing, reports_end
from .operations import Evidence, Operation
from .runs import (
    Approve,
    Decidable,
    Decided,
    DecisionRequest,
    Edit,
    PendingPage,
    Reject,
    Run,
    RunState,
)
from .settings import Settings

if TYPE_CHECKING:
    from typing_extensions import Self

T = TypeVar("T")


class Client:
    """A blocking client of one gateway, with one API key.

    `timeout` bounds each request (a long poll gets its wait on top); `transport` replaces
    httpx's own (a mock in tests, a proxy); `poll_secs` is how long one look of `wait` may
    be held by the gateway (at most its `[door] max_wait_secs`, 60 by default).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        poll_secs: int = 30,
    ) -> None:
        self._settings = Settings(base_url, api_key, timeout, poll_secs)
        self._http = httpx.Client(
            base_url=self._settings.base_url,
            headers=self._settings.headers(),
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def send(self, operation: Operation[T]) -> T:
        """Sends one operation and reads its answer; every method below goes through here."""
        response = self._http.request(
            operation.method,
            operation.path,
            json=operation.json,
            params=operation.params,
            headers=operation.headers,
            timeout=self._settings.timeout_for(operation),
        )
        return operation.read(response)

    # Runs

    def start_run(
        self,
        agent: str,
        input: str,
        *,
        idempotency_key: str,
        requested_by: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> RunState:
        """Starts a run of `agent` on `input`; the same key again is the same run."""
        return self.send(
            operations.start_run(
                agent,
                input,
                idempotency_key=idempotency_key,
                requested_by=requested_by,
                metadata=metadata,
            )
        )

    def get_run(self, run_id: str) -> Run:
        return self.send(operations.get_run(run_id))

    def cancel_run(self, run_id: str, reason: str | None = None) -> RunState:
        """Asks the run to stop: no call of it starts from now on."""
        return self.send(operations.cancel_run(run_id, reason))

    def events(self, run_id: str, *, after: int | None = None) -> Iterator[Event]:
        """The run's live events from its first (or after event `after`) until its end,
        reconnecting with `Last-Event-ID` when the connection drops, so none is lost or
        repeated. Stops after `run.completed`, `run.failed` or `run.cancelled`, or at once
        for a run that ended before `after`."""
        following = Following(run_id, after)
        while not following.done:
            try:
                with self._http.stream(
                    "GET",
                    following.path,
                    headers=following.headers(),
                    timeout=self._settings.stream_timeout(),
                ) as response:
                    if response.status_code != 200:
                        response.read()
                    if following.opened(response):
                        for text in response.iter_text():
                            yield from following.feed(text)
                            if following.done:
                                return
                        following.dropped(None)
            except httpx.TransportError as error:
                following.dropped(error)
            if not following.done:
                time.sleep(following.pause())

    # Decisions

    def pending(self, *, limit: int | None = None, cursor: str | None = None) -> PendingPage:
        """One page of the calls waiting for a person that this key may read."""
        return self.send(operations.pending(limit, cursor))

    def decide(
        self,
        run_id: str,
        decisions: Sequence[DecisionRequest],
        *,
        decided_by: str | None = None,
    ) -> Decided:
        """Records decisions on held calls of one run, all or none."""
        return self.send(operations.decide(run_id, decisions, decided_by))

    def approve(
        self, call: Decidable, *, note: str | None = None, decided_by: str | None = None
    ) -> Decided:
        """Approves `call` as it was shown (its digest)."""
        return self.decide(call.run_id, [Approve.of(call, note=note)], decided_by=decided_by)

    def edit(
        self,
        call: Decidable,
        input: Any,
        *,
        note: str | None = None,
        decided_by: str | None = None,
    ) -> Decided:
        """Approves `call` with `input` instead of the agent's."""
        decision = Edit.of(call, input, note=note)
        return self.decide(call.run_id, [decision], decided_by=decided_by)

    def reject(self, call: Decidable, reason: str, *, decided_by: str | None = None) -> Decided:
        """Rejects `call`; the agent is told `reason`."""
        return self.decide(call.run_id, [Reject.of(call, reason)], decided_by=decided_by)

    # The door for agents written in code

    def ask(
        self,
        agent: str,
        tool: str,
        input: Any,
        *,
        idempotency_key: str,
        task: str | None = None,
        message: str = "",
        evidence: Sequence[Evidence | Mapping[str, Any]] = (),
        session: str | None = None,
        requested_by: str | None = None,
        wait_secs: int | None = None,
    ) -> Call:
        """Asks whether `agent` may call `tool` with `input`. Answered with the outcome when
        it comes within `wait_secs` (the gateway's default, 10, when None), else with the
        call still `pending`: `wait` for it. The same `idempotency_key` with the same ask is
        the same call, never asked of a person twice nor run twice."""
        return self.send(
            operations.ask(
                agent,
                tool,
                input,
                idempotency_key=idempotency_key,
                task=task,
                message=message,
                evidence=evidence,
                session=session,
                requested_by=requested_by,
                wait_secs=wait_secs,
            )
        )

    def get_call(self, run_id: str, call_id: str, *, wait_secs: int | None = None) -> Call:
        """The call as it stands once it has its outcome, or when `wait_secs` are up (the
        gateway's default, 10, when None; 0 to look without waiting)."""
        return self.send(operations.get_call(run_id, call_id, wait_secs))

    def wait(self, call: Call, timeout: float | None = None) -> Call:
        """Waits for `call`'s outcome, at most `timeout` seconds (None: as long as it takes),
        and returns the call as it then stands: check `outcome_reached`, or let
        `raise_for_outcome` refuse anything that may not run."""
        flow = operations.waiting(call, timeout, self._settings.poll_secs)
        return operations.drive(flow, self.send)

    def executing(self, call: Call) -> Executing:
        """Runs a call released to the agent under its execution record::

            with client.executing(call) as attempt:
                attempt.result = send_email(**call.input)

        Claims the call before the block, reports `succeeded` with `attempt.result` after
        it, or `failed` with the exception's text if it raises (and re-raises). Raises
        `AlreadyExecuted` or `ExecutionInDoubt`, running nothing, when another attempt
        claimed the call."""
        return Executing(self, call)


class Executing:
    """The context manager `Client.executing` gives."""

    def __init__(self, client: Client, call: Call) -> None:
        self._client = client
        self._attempt = Attempt(call)

    def __enter__(self) -> Attempt:
        operations.drive(self._attempt.claim(), self._client.send)
        return self._attempt

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not reports_end(error):
            return
        finish = self._attempt.finish(error)
        if error is None:
            operations.drive(finish, self._client.send)
            return
        with logged_if_failing(self._attempt):
            operations.drive(finish, self._client.send)
