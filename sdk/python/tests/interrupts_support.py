"""What the tests of the adapters for the OpenAI Agents SDK and LangGraph share: the desk's
tools as the framework runs them (each run recorded, and the receipt it ran under checked as
a real tool would), a reviewer who decides a call once it is held, checking a receipt, and
an agent whose held calls expire within seconds."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from countersign import AsyncClient, Call, Client, NotFound, PendingCall, Status, Unprocessable
from countersign.adapters.interrupts import running_call
from countersign.receipts import Checked, MemoryJtis, Verifier

from .conftest import Gateway
from .support import AGENT, WITHIN_SECS

#: An agent of its own whose `send_email` expires two seconds after it is held, written into
#: the session's agents folder beside `desk` (the runner reloads the folder by itself).
BRIEF_AGENT = f"{AGENT}-brief"
BRIEF_AGENT_FILE = """\
name = "{agent}"

[model]
provider = "external"

[[tools]]
name = "send_email"
input_schema = {{ type = "object", properties = {{ to = {{ type = "string" }}, body = {{ type = "string" }} }}, required = ["to", "body"] }}
[tools.approval]
timeout = "2s"

[[tools]]
name = "note_customer"
input_schema = {{ type = "object", properties = {{ customer = {{ type = "string" }}, note = {{ type = "string" }} }}, required = ["customer", "note"] }}
approval = "never"
"""


def fresh(prefix: str) -> str:
    """An id no other test uses: sessions, tool call ids, order ids."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def check_receipt(gateway: Gateway, call: Call, tool: str, input: Any) -> Checked:
    """The call's receipt checked as `tool` would check it, against the gateway's published
    keys, for a request whose body is `input`."""
    headers = call.receipt_headers()
    assert headers, f"no receipt on {call}"
    verifier = Verifier(gateway.jwks_url, tool, gateway.url, MemoryJtis())
    return verifier.check(
        headers["Countersign-Receipt"],
        tool=tool,
        idempotency_key=headers["Idempotency-Key"],
        body=json.dumps(input).encode(),
    )


class Desk:
    """The desk's tools as the framework's side has them, named as in the agent file. Each
    run is recorded with its input, and a run under a person's decision checks the receipt
    it was released with, as the real tool would before acting."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        #: (tool, input) of each run, in order.
        self.ran: list[tuple[str, dict[str, Any]]] = []
        #: (tool, the receipt's action) of each run that had a receipt.
        self.receipts: list[tuple[str, str]] = []

    def _run(self, tool: str, input: dict[str, Any]) -> None:
        call = running_call()
        assert call is not None and call.tool == tool, "a countersigned tool ran outside its call"
        assert call.input == input, (call.input, input)
        if call.receipt is not None:
            checked = check_receipt(self.gateway, call, tool, input)
            self.receipts.append((tool, checked.claims.action))
        self.ran.append((tool, input))

    def tools(self) -> list[Callable[..., str]]:
        def issue_refund(order_id: str, amount: float) -> str:
            """Refund an order (countersign's worker runs it: it has an endpoint)."""
            self._run("issue_refund", {"order_id": order_id, "amount": amount})
            return "refunded by the agent"

        def send_email(to: str, body: str) -> str:
            """Email a customer."""
            self._run("send_email", {"to": to, "body": body})
            return f"sent to {to}"

        def note_customer(customer: str, note: str) -> str:
            """Note something about a customer."""
            self._run("note_customer", {"customer": customer, "note": note})
            return f"noted about {customer}"

        return [issue_refund, send_email, note_customer]


def held(reviewer: Client, tool: str, input: Any, within: float = WITHIN_SECS) -> PendingCall:
    """The call of `tool` with `input` once it waits for a person."""
    deadline = time.monotonic() + within
    while True:
        for call in reviewer.pending(limit=500).approvals:
            if call.tool == tool and call.input == input:
                return call
        assert time.monotonic() < deadline, f"no {tool} call held with {input} in {within}s"
        time.sleep(0.05)


def pending_with(reviewer: Client, tool: str, input: Any) -> list[PendingCall]:
    """The calls of `tool` with `input` waiting for a person now."""
    return [c for c in reviewer.pending(limit=500).approvals if (c.tool, c.input) == (tool, input)]


class WaitedClient(Client):
    """The agent's client, which says when the adapter starts waiting for a person."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting = threading.Event()

    def wait(self, call: Call, timeout: float | None = None) -> Call:
        self.waiting.set()
        return super().wait(call, timeout)


class WaitedAsyncClient(AsyncClient):
    """`WaitedClient` for asyncio."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting = threading.Event()

    async def wait(self, call: Call, timeout: float | None = None) -> Call:
        self.waiting.set()
        return await super().wait(call, timeout)


def decide_when_waited(
    pool: ThreadPoolExecutor,
    agent: WaitedClient | WaitedAsyncClient,
    reviewer: Client,
    tool: str,
    input: Any,
    decide: Callable[[Client, PendingCall], object],
) -> Future[PendingCall]:
    """A reviewer in another thread who decides the call once it is held and the agent's
    adapter has paused the framework and waits for the decision (in this thread); the
    future is the call as it was held."""

    def review() -> PendingCall:
        call = held(reviewer, tool, input)
        assert agent.waiting.wait(WITHIN_SECS), "the adapter never waited for a person"
        decide(reviewer, call)
        return call

    return pool.submit(review)


def brief_agent(client: Client, gateway: Gateway) -> str:
    """`BRIEF_AGENT`, written into the runner's agents folder if it is not there yet, once
    both the gateway and the worker have it: a call of it that needs nobody is answered."""
    agents = gateway.log.parent / "agents"
    path = agents / f"{BRIEF_AGENT}.toml"
    if not path.exists():
        path.write_text(BRIEF_AGENT_FILE.format(agent=BRIEF_AGENT))
    deadline = time.monotonic() + WITHIN_SECS
    note = {"customer": "ana", "note": "loaded?"}
    while True:
        try:
            # The gateway knows the agent once an input that does not fit is refused.
            client.ask(BRIEF_AGENT, "note_customer", {}, idempotency_key=fresh("probe"))
        except Unprocessable:
            break
        except NotFound:
            assert time.monotonic() < deadline, f"{BRIEF_AGENT} not loaded in {WITHIN_SECS}s"
            time.sleep(0.1)
    # The worker knows it once it lets a call of it through; until it has reloaded the
    # folder too, it fails the call ("not defined"), so ask again.
    while True:
        call = client.ask(BRIEF_AGENT, "note_customer", note, idempotency_key=fresh("probe"))
        call = client.wait(call, timeout=WITHIN_SECS)
        if call.status is Status.ALLOWED:
            return BRIEF_AGENT
        assert time.monotonic() < deadline, f"the worker has not loaded {BRIEF_AGENT}: {call}"
        time.sleep(0.1)
