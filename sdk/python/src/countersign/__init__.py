"""countersign: a person between an AI agent and its risky tool calls.

`Client` (blocking) and `AsyncClient` (asyncio) speak the gateway's API: the door for agents
written in code (`ask`, `wait`, `executing`), runs and their live events, the calls waiting
for a person and the decisions on them. `countersign.receipts` checks countersignature
receipts in a tool; `countersign.fastapi` does it as a FastAPI dependency.
"""

from .async_client import AsyncClient, AsyncExecuting
from .calls import (
    Call,
    CallResult,
    Decision,
    Executes,
    Execution,
    ExecutionStatus,
    Held,
    Status,
)
from .client import Client, Executing
from .errors import (
    AlreadyExecuted,
    BadRequest,
    Cancelled,
    Conflict,
    CountersignError,
    ExecutionClaimed,
    ExecutionInDoubt,
    Expired,
    Failed,
    Forbidden,
    Gone,
    MethodNotAllowed,
    NotFound,
    OutcomeError,
    RefusalCode,
    Refused,
    Rejected,
    StillPending,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    Unprocessable,
)
from .events import END_TYPES, Event, StreamLost
from .execution import Attempt
from .operations import Evidence
from .runs import (
    Approve,
    CallDecided,
    Decidable,
    Decided,
    DecisionRequest,
    Edit,
    PendingCall,
    PendingPage,
    Reject,
    Run,
    RunState,
)
from .version import VERSION as __version__

__all__ = [
    "END_TYPES",
    "AlreadyExecuted",
    "Approve",
    "AsyncClient",
    "AsyncExecuting",
    "Attempt",
    "BadRequest",
    "Call",
    "CallDecided",
    "CallResult",
    "Cancelled",
    "Client",
    "Conflict",
    "CountersignError",
    "Decidable",
    "Decided",
    "Decision",
    "DecisionRequest",
    "Edit",
    "Event",
    "Evidence",
    "Executes",
    "Executing",
    "Execution",
    "ExecutionClaimed",
    "ExecutionInDoubt",
    "ExecutionStatus",
    "Expired",
    "Failed",
    "Forbidden",
    "Gone",
    "Held",
    "MethodNotAllowed",
    "NotFound",
    "OutcomeError",
    "PendingCall",
    "PendingPage",
    "RefusalCode",
    "Refused",
    "Reject",
    "Rejected",
    "Run",
    "RunState",
    "Status",
    "StillPending",
    "StreamLost",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
    "Unprocessable",
    "__version__",
]
