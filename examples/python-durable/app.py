"""A support desk's agent as a web service that never waits for a person.

A message starts a Pydantic AI run whose tools are under countersign. When a call is held
for a person, the run pauses: its conversation (Pydantic AI's own `Conversation`: messages,
usage, and the deferred requests it waits on) is saved to disk under the countersign runs of
its held calls, and the request is answered 202. When a decision arrives (a webhook, a
poller, or you with curl), `POST /countersign/runs/{run_id}/decided` loads the conversation
in whatever process gets it and resumes the run: a refund comes back from countersign's
worker, an email is sent here, once, with the input the reviewer approved.

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
from countersign.adapters.pydantic_ai import (
    CallRef,
    CountersignToolset,
    countersign_results,
    paused_calls,
)
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic_ai import Agent, DeferredToolRequests, FunctionToolset
from pydantic_ai.conversation import Conversation, ConversationTypeAdapter
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

COUNTERSIGN_URL = os.environ.get("COUNTERSIGN_URL", "http://127.0.0.1:8080")
COUNTERSIGN_KEY = os.environ.get("COUNTERSIGN_KEY", "local-requester-key-0000")
STATE = Path(os.environ.get("DESK_STATE", "desk-state"))
#: How long a resume waits for calls it was told were decided: a decision takes a moment to
#: release its call once recorded, and a webhook may tell of it sooner.
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
    outbox = STATE / "outbox.jsonl"
    with outbox.open("a") as sent:
        sent.write(json.dumps({"to": to, "body": body}) + "\n")
    return {"status": "sent", "to": to}


class Conversations:
    """Paused conversations on disk, each under the countersign runs it waits on."""

    def __init__(self, root: Path) -> None:
        self.by_id = root / "conversations"
        self.by_run = root / "runs"
        self.by_id.mkdir(parents=True, exist_ok=True)
        self.by_run.mkdir(parents=True, exist_ok=True)

    def save(self, conversation: Conversation) -> list[CallRef]:
        """Saves `conversation`; the countersign calls it waits on, if it is paused."""
        path = self.by_id / f"{conversation.conversation_id}.json"
        # Written whole and renamed, so that a crash never leaves half a conversation.
        partial = path.with_suffix(".partial")
        partial.write_bytes(ConversationTypeAdapter.dump_json(conversation))
        partial.replace(path)
        requests = conversation.deferred_tool_requests
        waiting_on = list(paused_calls(requests).values()) if requests else []
        for ref in waiting_on:
            (self.by_run / ref.run_id).write_text(conversation.conversation_id)
        return waiting_on

    def of_run(self, run_id: str) -> Conversation | None:
        index = self.by_run / run_id
        if not index.is_file():
            return None
        path = self.by_id / f"{index.read_text()}.json"
        return ConversationTypeAdapter.validate_json(path.read_bytes())


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
        app.state.conversations = Conversations(STATE)
        yield


app = FastAPI(lifespan=lifespan)


def answered(conversation: Conversation, output: Any, conversations: Conversations) -> Any:
    """The run's answer (200), or where it waits (202), once its conversation is saved."""
    waiting_on = conversations.save(conversation)
    body = {"conversation_id": conversation.conversation_id}
    if isinstance(output, DeferredToolRequests):
        calls = [{"run_id": ref.run_id, "call_id": ref.call_id} for ref in waiting_on]
        return JSONResponse({**body, "waiting_on": calls}, status_code=202)
    return {**body, "answer": output}


@app.post("/messages")
async def message(message: Message) -> Any:
    """A customer's message: answered, or paused on the calls a person must decide."""
    result = await app.state.agent.run(message.text, conversation_id=message.conversation_id)
    return answered(result.conversation, result.output, app.state.conversations)


@app.post("/countersign/runs/{run_id}/decided")
async def decided(run_id: str) -> Any:
    """A held call of `run_id` was decided: resumes its conversation once all its held calls
    are. Safe to call again, or from several processes: a call runs once."""
    conversation = app.state.conversations.of_run(run_id)
    if conversation is None:
        raise HTTPException(404, f"no conversation waits on run {run_id}")
    requests = conversation.deferred_tool_requests
    if requests is None:
        return {"conversation_id": conversation.conversation_id, "answer": _last_text(conversation)}
    results = await countersign_results(app.state.client, requests, timeout=DECIDED_WITHIN_SECS)
    if requests.remaining(results) is not None:
        raise HTTPException(409, "some of its calls still wait for a person")
    result = await app.state.agent.run(conversation=conversation, deferred_tool_results=results)
    return answered(result.conversation, result.output, app.state.conversations)


def _last_text(conversation: Conversation) -> str:
    """The answer of a conversation that was already resumed."""
    for message in reversed(conversation.messages):
        if isinstance(message, ModelResponse):
            return "".join(p.content for p in message.parts if isinstance(p, TextPart))
    return ""
