"""What the adapters whose framework runs a tool once its approval is settled (Pydantic AI,
chatlas) give the model for a call that may run: the result of a tool countersign ran
itself, or the framework's tool run with countersign's input inside the call's execution
claim, with the call as `interrupts.running_call()` (its input, its receipt). The claim is
what keeps a call asked again, from another process, from running twice.

Imported by those adapters only: it needs pydantic, which both frameworks depend on.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic_core import to_jsonable_python

from ..async_client import AsyncClient
from ..calls import Call, Status
from ..client import Client
from ..errors import AlreadyExecuted
from .interrupts import failure, running

#: What the model is told beside the result of a call a reviewer edited: the arguments in its
#: own history are the ones it gave, not the ones that ran.
EDITED = (
    "A person edited this call in countersign before it ran: it ran with {input}, "
    "not the arguments you gave."
)


def edited(call: Call) -> str | None:
    """What the model is told of an edit, for a call a reviewer edited; None for any other."""
    return EDITED.format(input=json.dumps(call.input)) if call.status is Status.EDITED else None


def countersign_error(call: Call) -> str | None:
    """What the model is told, as the tool's error, of a call that failed, or whose tool
    countersign ran answered an error; None for any other."""
    if call.status is Status.FAILED:
        return failure(call)
    if call.result is not None and call.result.is_error:
        return call.result.content
    return None


def countersign_result(call: Call) -> str:
    """What the tool countersign ran answered, as its worker recorded it."""
    if call.result is None:
        raise ValueError(f"call {call.call_id} of run {call.run_id} has no result")
    return call.result.content


def failed_elsewhere(done: AlreadyExecuted) -> str:
    """What the model is told, as the tool's error, of a call another attempt ran and that
    failed there."""
    return f"{done}: {done.error}"


def run_released(client: Client, call: Call, run: Callable[[], Any]) -> Any:
    """`run()` (the framework's tool, with `call.input`) inside the call's execution claim:
    claimed before, its result reported after. When another attempt claimed the call first,
    nothing runs: the result it recorded is given back, or `AlreadyExecuted` raised when it
    failed there, or `ExecutionInDoubt` when it never said how it ended (a person must
    check)."""
    try:
        with client.executing(call) as attempt:
            with running(attempt.call):
                result = run()
            attempt.result = _recordable(result)
    except AlreadyExecuted as done:
        return _recorded(done)
    return result


async def run_released_async(
    client: AsyncClient, call: Call, run: Callable[[], Awaitable[Any]]
) -> Any:
    """`run_released` for asyncio."""
    try:
        async with client.executing(call) as attempt:
            with running(attempt.call):
                result = await run()
            attempt.result = _recordable(result)
    except AlreadyExecuted as done:
        return _recorded(done)
    return result


def _recordable(result: Any) -> Any:
    """The tool's result as JSON for the execution record. Never raises: the side effect has
    happened, and is not to be reported failed because its result does not serialize."""
    return to_jsonable_python(result, fallback=repr)


def _recorded(done: AlreadyExecuted) -> Any:
    if done.error is not None:
        raise done
    return done.result
