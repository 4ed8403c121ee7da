"""What can go wrong, as exceptions.

Three families:

- The gateway refused a request: `CountersignError` and a subclass per class of answer
  (`Unauthorized` for 401, `Conflict` for 409, ...), built from the error body
  `{"error": {"code", "message", "refusal"?, "details"?}}`. A decision the decision script
  or the rule of who may act refused carries `refusal`, its exact reason, and is raised as
  `Refused` whatever its status: the refusal says more than the status does.
- A door call ended without a permission to run (`Call.raise_for_outcome`): `Rejected`,
  `Expired`, `Cancelled`, `Failed`, or `StillPending` for a call not decided yet.
- A call the agent runs itself was claimed by another attempt (`executing`):
  `AlreadyExecuted` when that attempt finished, `ExecutionInDoubt` when it started and never
  said how it ended.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from .calls import Call, Execution


class RefusalCode(str, Enum):
    """Why a decision was refused, by the one name the decision script, the metric and the
    API's `error.refusal` share (model/src/refusal.rs)."""

    DECIDED = "decided"
    NOT_WAITING = "not_waiting"
    NO_CALL = "no_call"
    STALE_DIGEST = "stale_digest"
    PAST_DEADLINE = "past_deadline"
    NOT_APPROVER = "not_approver"
    ABOVE_LIMIT = "above_limit"
    OWN_REQUEST = "own_request"
    COUNTED_OTHERWISE = "counted_otherwise"
    EDIT_WITH_QUORUM = "edit_with_quorum"
    EDIT_UNCHECKED = "edit_unchecked"
    LINK_USED = "link_used"
    ROLE_MAY_NOT_DECIDE = "role_may_not_decide"
    RUN_CANCELLED = "run_cancelled"
    GRANT_SHORT = "grant_short"
    GRANT_MISMATCH = "grant_mismatch"
    RECEIPT_STALE = "receipt_stale"
    MODEL_NAME = "model_name"
    NO_MODEL_APPROVAL = "no_model_approval"


class CountersignError(Exception):
    """The gateway answered a request with an error."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        refusal: RefusalCode | str | None = None,
        details: Any = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        #: The stable class of the error (`not_found`, `stale_digest`, `execution_taken`, ...).
        self.code = code
        self.message = message
        #: For a refused decision, its exact reason; a code this SDK does not know yet stays
        #: the plain string the gateway sent.
        self.refusal = refusal
        #: Whatever the gateway added (a refused execution report's `execution`, the errors
        #: of an edit that does not fit its schema, ...).
        self.details = details


class BadRequest(CountersignError):
    """400: the request is malformed or incomplete."""


class Unauthorized(CountersignError):
    """401: no key, or one the gateway does not know."""


class Forbidden(CountersignError):
    """403: the key's role, or the person it speaks for, may not do this."""


class NotFound(CountersignError):
    """404: no such run, call, agent or tool (or route)."""


class MethodNotAllowed(CountersignError):
    """405: the route does not take this method."""


class Conflict(CountersignError):
    """409: the state of the run or call does not allow it."""


class Gone(CountersignError):
    """410: a deadline passed, or a link was used."""


class Unprocessable(CountersignError):
    """422: the input does not fit the tool's schema, or an idempotency key was reused for
    another request."""


class TooManyRequests(CountersignError):
    """429: past a cap (live event streams); `retry_after` says when to try again."""

    retry_after: float | None = None


class Unavailable(CountersignError):
    """503: the gateway cannot reach what it needs (Redis) just now."""


class Refused(CountersignError):
    """A decision refused by the decision script or the rule of who may act; `refusal` is
    its exact reason (a `RefusalCode` when this SDK knows it)."""


_BY_STATUS: dict[int, type[CountersignError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    422: Unprocessable,
    429: TooManyRequests,
    503: Unavailable,
}


def error_from_response(response: httpx.Response) -> CountersignError:
    """The exception for an error answer, read from its body when it has the API's shape
    and said in the status's words when it does not (a proxy's page, an empty body)."""
    code, message, refusal, details = _read_error_body(response)
    kind = Refused if refusal is not None else _BY_STATUS.get(response.status_code)
    if kind is None:
        kind = CountersignError
    error = kind(
        response.status_code,
        code or f"http_{response.status_code}",
        message or response.reason_phrase or "error",
        refusal=_refusal_code(refusal),
        details=details,
    )
    if isinstance(error, TooManyRequests):
        error.retry_after = _retry_after(response)
    return error


def _read_error_body(response: httpx.Response) -> tuple[str, str, str | None, Any]:
    try:
        body = response.json()
    except ValueError:
        return "", response.text.strip()[:500], None, None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "", str(error or "")[:500], None, None
    refusal = error.get("refusal")
    return (
        str(error.get("code") or ""),
        str(error.get("message") or ""),
        refusal if isinstance(refusal, str) else None,
        error.get("details"),
    )


def _refusal_code(refusal: str | None) -> RefusalCode | str | None:
    if refusal is None:
        return None
    try:
        return RefusalCode(refusal)
    except ValueError:
        return refusal


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


class OutcomeError(Exception):
    """A door call whose outcome does not let it run (see `Call.raise_for_outcome`)."""

    def __init__(self, call: Call, message: str) -> None:
        super().__init__(message)
        #: The call's latest view.
        self.call = call


class Rejected(OutcomeError):
    """A person rejected the call; `reason` is theirs."""

    def __init__(self, call: Call) -> None:
        self.reason = call.decision.reason if call.decision else None
        who = call.decision.decided_by if call.decision else "a reviewer"
        super().__init__(call, f"{call.tool} was rejected by {who}: {self.reason}")


class Expired(OutcomeError):
    """Nobody decided before the call's deadline; it must not run."""

    def __init__(self, call: Call) -> None:
        super().__init__(call, f"{call.tool} expired undecided: it must not run")


class Cancelled(OutcomeError):
    """The call's run was cancelled before the call ran."""

    def __init__(self, call: Call) -> None:
        super().__init__(call, f"{call.tool} was cancelled before it ran")


class Failed(OutcomeError):
    """The call failed: the tool countersign ran answered an error or could not be reached,
    its outcome was lost in a crash, or its run failed; `error` says which."""

    def __init__(self, call: Call) -> None:
        self.error = call.error
        super().__init__(call, f"{call.tool} failed: {call.error}")


class StillPending(OutcomeError):
    """The call has no outcome yet (it waits for a person, or is being sorted): it must not
    run until it has one."""

    def __init__(self, call: Call) -> None:
        super().__init__(call, f"{call.tool} has no outcome yet (status {call.status})")


class ExecutionClaimed(Exception):
    """Another attempt claimed a call the agent runs itself; this one must not run it."""

    def __init__(self, execution: Execution, message: str) -> None:
        super().__init__(message)
        #: The other attempt's execution record.
        self.execution = execution


class AlreadyExecuted(ExecutionClaimed):
    """Another attempt ran the call and reported how it ended; `result` (or `error`) is
    what it recorded."""

    def __init__(self, execution: Execution) -> None:
        self.result = execution.result
        self.error = execution.error
        super().__init__(
            execution,
            f"the call was already run by attempt {execution.attempt!r} "
            f"({execution.reported_by}), which {execution.status.value}",
        )


class ExecutionInDoubt(ExecutionClaimed):
    """Another attempt started the call and never said how it ended: it may have had its
    effect. A person must check; it is never run again silently."""

    def __init__(self, execution: Execution) -> None:
        super().__init__(
            execution,
            f"the call was started by attempt {execution.attempt!r} "
            f"({execution.reported_by}) and never reported finished: it may have run; "
            "a person must check before anything runs it again",
        )
