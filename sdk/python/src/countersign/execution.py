"""Running a call released to the agent, and saying so (`POST
/v1/runs/{run}/calls/{call}/execution`): one attempt claims the call (`started`) before its
side effect, then reports `succeeded` with the result or `failed` with the error. The claim
is what keeps the same call, asked again from another process after a crash, from running
twice: that process finds it claimed and does not run it.

`Attempt` holds one attempt's steps as flows (see `operations`), which the clients'
`executing` context managers drive.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import operations
from .calls import Call, Execution, ExecutionStatus
from .errors import AlreadyExecuted, Conflict, ExecutionClaimed, ExecutionInDoubt
from .operations import Flow

log = logging.getLogger("countersign")

#: The longest error text reported: the rest of a long message is the tool's log's to keep.
MAX_ERROR_CHARS = 4000


class Attempt:
    """One attempt at running `call`. Inside `executing`, set `result` to what the call gave
    (any JSON value): it is reported when the block ends without an exception."""

    def __init__(self, call: Call) -> None:
        #: Random per attempt: a claim sent again after a lost answer is the same claim,
        #: and nobody else's.
        self.id = secrets.token_hex(16)
        #: The call as the gateway last answered about it.
        self.call = call
        self.result: Any = None

    def claim(self) -> Flow[Call]:
        """Claims the call for this attempt, or raises `AlreadyExecuted` /
        `ExecutionInDoubt` when another attempt has."""
        if self.call.execution is not None:
            raise claimed(self.call.execution)
        view: Call
        try:
            view = yield operations.report_execution(
                self.call, {"attempt": self.id, "status": "started"}
            )
        except Conflict as taken:
            if taken.code != "execution_taken":
                raise
            # The refusal names the claim; the call's view says how it ended, if it did.
            view = yield operations.get_call(self.call.run_id, self.call.call_id, 0)
            record = view.execution or _started(taken.details)
            if record is None:
                raise
            raise claimed(record) from taken
        self.call = view
        return view

    def finish(self, error: BaseException | None) -> Flow[Call]:
        """Reports how the call ended: `succeeded` with `result`, or `failed` with `error`."""
        if error is None:
            report = {"attempt": self.id, "status": "succeeded", "result": self.result}
        else:
            text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            report = {"attempt": self.id, "status": "failed", "error": text[:MAX_ERROR_CHARS]}
        self.call = yield operations.report_execution(self.call, report)
        return self.call


def claimed(record: Execution) -> ExecutionClaimed:
    """What another attempt's claim means for this one."""
    if record.finished:
        return AlreadyExecuted(record)
    return ExecutionInDoubt(record)


def _started(details: Any) -> Execution | None:
    """The claim a refusal names, when the call's view did not show it."""
    claim = details.get("execution") if isinstance(details, dict) else None
    if not isinstance(claim, dict):
        return None
    return Execution(
        status=ExecutionStatus(claim.get("status", "started")),
        attempt=str(claim.get("attempt", "")),
        reported_by=str(claim.get("reported_by", "")),
        started_at=None,
    )


def reports_end(error: BaseException | None) -> bool:
    """Whether the end of a block that raised `error` is reported at all. An interruption
    (Ctrl-C, a cancelled task, the process exiting) may have come before or after the side
    effect: the claim is left standing, so the call reads as in doubt instead of failed."""
    return error is None or isinstance(error, Exception)


@contextmanager
def logged_if_failing(attempt: Attempt) -> Iterator[None]:
    """For the report of a block that raised: the block's exception is the one the caller
    must see, so a report that fails as well is logged rather than raised over it."""
    try:
        yield
    except Exception:
        log.exception(
            "could not report that attempt %s of call %s of run %s failed; it stays started",
            attempt.id,
            attempt.call.call_id,
            attempt.call.run_id,
        )
