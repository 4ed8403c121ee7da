"""A support desk's agent as a web service that never waits for a person.

A message starts a Pydantic AI run whose tools are under countersign. When a call is held
for a person, the run pauses: `start` saves it (Pydantic AI's own `Conversation`: messages,
usage, and the deferred requests it waits on) in a folder, under the countersign ids of its
held calls, and the request is answered 202. When a decision arrives (a webhook, a poller,
or you with curl), `POST /countersign/runs/{run_id}/calls/{call_id}/decided` has `resume`
load it in whatever process gets the request and run it on: a refund comes back from
countersign's worker, an email is sent here, once, with the input the reviewer approved.

The model is a `FunctionModel` that reads the message, so that it runs without keys:
"refund A-1001 40" asks for a refund, "email ana@example.com Your refund is on its way"
for an email.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from countersign import AsyncClient
from countersign.adapters.interrupts import FilePauses, Pause
from countersign.adapters.pydantic_ai import CountersignToolset, resume, start
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic_ai import Agent, DeferredToolRequests, FunctionToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.run import AgentRunResult

COUNTERSIGN_URL = os.environ.get("COUNTERSIGN_URL", "http://127.0.0.1:8080")
COUNTERSIGN_KEY = os.environ.get("COUNTERSIGN_KEY", "local-requester-key-0000")
STATE = Path(os.environ.get("DESK_STATE", "desk-state"))
#: How long a resume waits for the calls it was told were decided: a decision takes a
#: moment to release its call once recorded, and a webhook may tell of it sooner.
DECIDED_WITHIN_SECS = 5


def desk_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asks for the tool the message names; once results are back, says what they were."""
    last = messages[-1]
    assert isinstance(last, ModelRequest)
    returned = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    if returned:
        return ModelResponse(
            parts=[TextPart("\n".join(f"{p.tool_name}: {p.content}" for p in returned))]
        )
    request = next(
        p.content
        for p in last.parts
        if isinstance(p, UserPromptPart) and isinstance(p.content, str)
    )
    verb, _, rest = request.partition(" ")
    if verb == "refund":
        order_id, amount = rest.split()
        call = ToolCallPart("issue_refund", {"order_id": order_id, "amount": float(amount)})
    elif verb == "email":
        to, _, body = rest.partition(" ")
        call = ToolCallPart("send_email", {"to": to, "body": body})
    else:
        return ModelResponse(parts=[TextPart('Try "refund A-1001 40" or "email TO BODY".')])
    return ModelResponse(parts=[TextPart(f"I will {verb} as asked."), call])


def issue_refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    # The agent file gives this tool an endpoint: countersign's worker runs it, and the
    # adapter gives the model its result. It is declared here for the model only.
    raise AssertionError("countersign runs refunds")


def send_email(to: str, body: str) -> dict[str, str]:
    """Email a customer."""
    with (STATE / "outbox.jsonl").open("a") as outbox:
        outbox.write(json.dumps({"to": to, "body": body}) + "\n")
    return {"status": "sent", "to": to}


class Message(BaseModel):
    text: str
    conversation_id: str | None = None


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with AsyncClient(COUNTERSIGN_URL, COUNTERSIGN_KEY) as client:
        tools = FunctionToolset([issue_refund, send_email])
        app.state.client = client
        app.state.agent = Agent(
            FunctionModel(desk_model),
            toolsets=[CountersignToolset(tools, client=client, agent="desk")],
            output_type=[str, DeferredToolRequests],
        )
        app.state.pauses = FilePauses(STATE / "pauses")
        yield


app = FastAPI(lifespan=lifespan)


def answered(outcome: AgentRunResult[Any] | Pause) -> Any:
    """The run's answer (200), or the countersign calls it waits on (202)."""
    if isinstance(outcome, Pause):
        calls = [{"run_id": c.run_id, "call_id": c.call_id} for c in outcome.calls]
        body = {"conversation_id": outcome.session, "waiting_on": calls}
        return JSONResponse(body, status_code=202)
    return {"conversation_id": outcome.conversation.conversation_id, "answer": outcome.output}


@app.post("/messages")
async def message(message: Message) -> Any:
    """A customer's message: answered, or paused on the calls a person must decide."""
    outcome = await start(
        app.state.agent,
        message.text,
        store=app.state.pauses,
        conversation_id=message.conversation_id,
    )
    return answered(outcome)


@app.post("/countersign/runs/{run_id}/calls/{call_id}/decided")
async def decided(run_id: str, call_id: str) -> Any:
    """Countersign call `call_id` of run `run_id` was decided: resumes the conversation that
    waits on it once all its calls are (202 while one still waits). Safe to call again, or
    from several processes: a call runs once."""
    outcome = await resume(
        app.state.agent,
        app.state.client,
        run_id,
        call_id,
        store=app.state.pauses,
        timeout=DECIDED_WITHIN_SECS,
    )
    if outcome is None:
        raise HTTPException(404, "nothing waits on this call (never, or resumed already)")
    return answered(outcome)
