"""`AsyncClient`: `Client`'s API for asyncio, over httpx's async client. Requests are built
and answers read in `operations`, as for `Client`; what differs here is only that sending
them is awaited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
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


class AsyncClient:
    """An asyncio client of one gateway, with one API key; see `Client` for the arguments
    and each method."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        poll_secs: int = 30,
    ) -> None:
        self._settings = Settings(base_url, api_key, timeout, poll_secs)
        self._http = httpx.AsyncClient(
            base_url=self._settings.base_url,
            headers=self._settings.headers(),
            timeout=timeout,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def send(self, operation: Operation[T]) -> T:
        response = await self._http.request(
            operation.method,
            operation.path,
            json=operation.json,
            params=operation.params,
            headers=operation.headers,
            timeout=self._settings.timeout_for(operation),
        )
        return operation.read(response)

    # Runs

    async def start_run(
        self,
        agent: str,
        input: str,
        *,
        idempotency_key: str,
        requested_by: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> RunState:
        return await self.send(
            operations.start_run(
                agent,
                input,
                idempotency_key=idempotency_key,
                requested_by=requested_by,
                metadata=metadata,
            )
        )

    async def get_run(self, run_id: str) -> Run:
        return await self.send(operations.get_run(run_id))

    async def cancel_run(self, run_id: str, reason: str | None = None) -> RunState:
        return await self.send(operations.cancel_run(run_id, reason))

    async def events(self, run_id: str, *, after: int | None = None) -> AsyncIterator[Event]:
        following = Following(run_id, after)
        while not following.done:
            try:
                async with self._http.stream(
                    "GET",
                    following.path,
                    headers=following.headers(),
                    timeout=self._settings.stream_timeout(),
                ) as response:
                    if response.status_code != 200:
                        await response.aread()
                    if following.opened(response):
                        async for text in response.aiter_text():
                            for event in following.feed(text):
                                yield event
                            if following.done:
                                return
                        following.dropped(None)
            except httpx.TransportError as error:
                following.dropped(error)
            if not following.done:
                await asyncio.sleep(following.pause())

    # Decisions

    async def pending(self, *, limit: int | None = None, cursor: str | None = None) -> PendingPage:
        return await self.send(operations.pending(limit, cursor))

    async def decide(
        self,
        run_id: str,
        decisions: Sequence[DecisionRequest],
        *,
        decided_by: str | None = None,
    ) -> Decided:
        return await self.send(operations.decide(run_id, decisions, decided_by))

    async def approve(
        self, call: Decidable, *, note: str | None = None, decided_by: str | None = None
    ) -> Decided:
        return await self.decide(call.run_id, [Approve.of(call, note=note)], decided_by=decided_by)

    async def edit(
        self,
        call: Decidable,
        input: Any,
        *,
        note: str | None = None,
        decided_by: str | None = None,
    ) -> Decided:
        decision = Edit.of(call, input, note=note)
        return await self.decide(call.run_id, [decision], decided_by=decided_by)

    async def reject(
        self, call: Decidable, reason: str, *, decided_by: str | None = None
    ) -> Decided:
        return await self.decide(call.run_id, [Reject.of(call, reason)], decided_by=decided_by)

    # The door for agents written in code

    async def ask(
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
        return await self.send(
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

    async def get_call(self, run_id: str, call_id: str, *, wait_secs: int | None = None) -> Call:
        return await self.send(operations.get_call(run_id, call_id, wait_secs))

    async def wait(self, call: Call, timeout: float | None = None) -> Call:
        flow = operations.waiting(call, timeout, self._settings.poll_secs)
        return await operations.drive_async(flow, self.send)

    def executing(self, call: Call) -> AsyncExecuting:
        """`Client.executing`, as an async context manager (`async with`)."""
        return AsyncExecuting(self, call)


class AsyncExecuting:
    """The async context manager `AsyncClient.executing` gives."""

    def __init__(self, client: AsyncClient, call: Call) -> None:
        self._client = client
        self._attempt = Attempt(call)

    async def __aenter__(self) -> Attempt:
        await operations.drive_async(self._attempt.claim(), self._client.send)
        return self._attempt

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not reports_end(error):
            return
        finish = self._attempt.finish(error)
        if error is None:
            await operations.drive_async(finish, self._client.send)
            return
        with logged_if_failing(self._attempt):
            await operations.drive_async(finish, self._client.send)
