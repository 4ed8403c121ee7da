"""The MCP proxy driven by the official MCP Python SDK's 1.x client, which speaks protocol
2025-11-25 and its experimental tasks: a held refund is a task the client follows
(`call_tool_as_task`, `get_task`, `get_task_result`, `cancel_task`) while a person decides it
through countersign's API; and a server written with the same SDK (`ledger_mcp`) behind the
proxy answers its client whole."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from mcp.types import CallToolResult, GetTaskResult, InitializeResult

from countersign import Client
from countersign.runs import PendingCall

from .conftest import REQUESTER_KEY, Gateway
from .ledger_mcp import PIXEL
from .support import LEDGER_AGENT, MCP_AGENT, WITHIN_SECS

pytestmark = [
    pytest.mark.asyncio,
    # The 1.x client marks its experimental tasks deprecated in favour of the Tasks extension
    # (which the proxy serves too, tested with rmcp): they are what 1.x clients speak.
    pytest.mark.filterwarnings("ignore:The experimental tasks API is deprecated"),
]

RELATED_TASK = "io.modelcontextprotocol/related-task"


@asynccontextmanager
async def session(
    gateway: Gateway, agent: str = MCP_AGENT
) -> AsyncIterator[tuple[ClientSession, InitializeResult]]:
    """An initialized session of `agent`'s proxy, with the requester's key, and how it was
    initialized."""
    url = f"{gateway.url}/mcp/{agent}"
    headers = {"Authorization": f"Bearer {REQUESTER_KEY}"}
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(httpx.AsyncClient(headers=headers))
        read, write, _ = await stack.enter_async_context(
            streamable_http_client(url, http_client=http)
        )
        opened = await stack.enter_async_context(ClientSession(read, write))
        yield opened, await opened.initialize()


def held(reviewer: Client, run_id: str) -> PendingCall:
    """The call of run `run_id` once it waits for a person."""
    deadline = time.monotonic() + WITHIN_SECS
    while True:
        for call in reviewer.pending(limit=500).approvals:
            if call.run_id == run_id:
                return call
        assert time.monotonic() < deadline, f"run {run_id} held no call in {WITHIN_SECS}s"
        time.sleep(0.05)


async def until(opened: ClientSession, task_id: str, status: str) -> GetTaskResult:
    """Task `task_id` once it is `status`."""
    deadline = time.monotonic() + WITHIN_SECS
    while True:
        got = await opened.experimental.get_task(task_id)
        if got.status == status:
            return got
        assert time.monotonic() < deadline, f"task {task_id} still {got.status}: {got}"
        await asyncio.sleep(0.05)


def refund(order: str, amount: float) -> dict[str, Any]:
    return {"order_id": order, "amount": amount, "reason": "damaged in transit"}


async def test_the_proxy_says_it_serves_tasks_and_a_held_refund_completes_once_approved(
    gateway: Gateway, reviewer: Client
) -> None:
    async with session(gateway) as (opened, hello):
        assert hello.protocolVersion == "2025-11-25"
        tasks = hello.capabilities.tasks
        assert tasks is not None and tasks.cancel is not None and tasks.list is None
        assert tasks.requests is not None and tasks.requests.tools is not None
        assert tasks.requests.tools.call is not None
        listed = {tool.name: tool for tool in (await opened.list_tools()).tools}
        execution = listed["issue_refund"].execution
        assert execution is not None and execution.taskSupport == "optional"

        created = await opened.experimental.call_tool_as_task(
            "issue_refund", refund("A-1001", 45.0)
        )
        task_id = created.task.taskId
        assert created.task.status == "working"
        assert created.task.pollInterval == 2000
        call = held(reviewer, task_id)
        waiting = await opened.experimental.get_task(task_id)
        assert waiting.status == "working"
        assert waiting.statusMessage is not None
        assert "moves money" in waiting.statusMessage, waiting
        assert waiting.ttl is None, "a waiting call is kept"

        reviewer.approve(call)
        done = await until(opened, task_id, "completed")
        assert done.ttl is not None, "a finished run expires"
        result = await opened.experimental.get_task_result(task_id, CallToolResult)
        assert not result.isError, result
        assert result.structuredContent is not None
        assert result.structuredContent["status"] == "refunded", result
        assert result.meta is not None
        assert result.meta[RELATED_TASK] == {"taskId": task_id}
        assert isinstance(result.meta["countersign.dev/receipt_jti"], str)


async def test_a_rejected_refund_s_task_completes_with_the_reviewer_s_reason(
    gateway: Gateway, reviewer: Client
) -> None:
    async with session(gateway) as (opened, _):
        created = await opened.experimental.call_tool_as_task(
            "issue_refund", refund("A-1002", 60.0)
        )
        task_id = created.task.taskId
        reviewer.reject(held(reviewer, task_id), "the order was never paid")
        # tasks/result waits for the answer, as 2025-11-25 says it does.
        result = await opened.experimental.get_task_result(task_id, CallToolResult)
        assert result.isError
        assert "the order was never paid" in str(result.content), result
        assert (await opened.experimental.get_task(task_id)).status == "completed"


async def test_a_task_the_client_cancels_is_a_cancelled_run_and_has_no_result(
    gateway: Gateway, reviewer: Client, client: Client
) -> None:
    async with session(gateway) as (opened, _):
        created = await opened.experimental.call_tool_as_task(
            "issue_refund", refund("A-1003", 70.0)
        )
        task_id = created.task.taskId
        held(reviewer, task_id)
        cancelled = await opened.experimental.cancel_task(task_id)
        assert cancelled.status == "cancelled", cancelled
        assert cancelled.statusMessage is not None
        assert "cancelled by" in cancelled.statusMessage, cancelled
        assert client.get_run(task_id).status == "cancelled"
        with pytest.raises(McpError, match="has no result"):
            await opened.experimental.get_task_result(task_id, CallToolResult)
        with pytest.raises(McpError, match="cannot be cancelled"):
            await opened.experimental.cancel_task(task_id)
        with pytest.raises(McpError, match="no task"):
            await opened.experimental.get_task("run_00000000000000000000000000000000")


async def test_a_python_sdk_server_s_answers_reach_the_client_whole(
    gateway: Gateway, reviewer: Client
) -> None:
    async with session(gateway, LEDGER_AGENT) as (opened, _):
        names = {tool.name for tool in (await opened.list_tools()).tools}
        assert names == {"balance", "chart", "write_off"}

        balance = await opened.call_tool("balance", {"customer": "ana"})
        assert not balance.isError, balance
        assert balance.structuredContent == {"customer": "ana", "cents": 1250}
        chart = await opened.call_tool("chart", {"customer": "ana"})
        image = chart.content[0]
        assert image.type == "image", chart
        assert image.mimeType == "image/png"
        assert base64.b64decode(image.data) == PIXEL

        # The server says write_off may destroy data: held, then run once approved, with a
        # receipt in its `_meta`.
        created = await opened.experimental.call_tool_as_task(
            "write_off", {"customer": "ana", "cents": 500}
        )
        task_id = created.task.taskId
        reviewer.approve(held(reviewer, task_id))
        written = await opened.experimental.get_task_result(task_id, CallToolResult)
        assert not written.isError, written
        assert written.structuredContent == {"customer": "ana", "cents": 500, "receipt": True}
