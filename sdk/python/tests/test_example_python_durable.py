"""examples/python-durable, the FastAPI service that pauses its Pydantic AI runs on disk, as
two processes against the real gateway and worker: the first pauses on a held call and is
gone, the second resumes it when told the call was decided, and resuming again runs nothing
again. (The example's `desk` agent has the session's agent's tools.)"""

from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient

from countersign import Client

from .conftest import REPOSITORY, Gateway
from .interrupts_support import held

EXAMPLE = REPOSITORY / "examples" / "python-durable" / "app.py"


def started(gateway: Gateway, state: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The example's module loaded afresh: one process of the service."""
    monkeypatch.setenv("COUNTERSIGN_URL", gateway.url)
    monkeypatch.setenv("DESK_STATE", str(state))
    spec = importlib.util.spec_from_file_location(f"durable_{uuid.uuid4().hex}", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_paused_run_is_resumed_by_another_process_and_runs_once(
    gateway: Gateway,
    reviewer: Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = f"Your refund is on its way ({uuid.uuid4()})"

    with TestClient(started(gateway, tmp_path, monkeypatch).app) as first:
        paused = first.post("/messages", json={"text": f"email ana@example.com {body}"})
    assert paused.status_code == 202, paused.text
    [waiting_on] = paused.json()["waiting_on"]
    decided = f"/countersign/runs/{waiting_on['run_id']}/calls/{waiting_on['call_id']}/decided"

    reviewer.approve(held(reviewer, "send_email", {"to": "ana@example.com", "body": body}))

    with TestClient(started(gateway, tmp_path, monkeypatch).app) as second:
        answered = second.post(decided)
        again = second.post(decided)

    assert answered.status_code == 200, answered.text
    assert answered.json()["answer"] == "send_email: {'status': 'sent', 'to': 'ana@example.com'}"
    assert again.status_code == 404  # resumed already: nothing runs again
    outbox = (tmp_path / "outbox.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in outbox] == [{"to": "ana@example.com", "body": body}]


def test_a_held_refund_is_resumed_with_what_countersign_ran(
    gateway: Gateway,
    reviewer: Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order = f"A-{uuid.uuid4()}"

    with TestClient(started(gateway, tmp_path, monkeypatch).app) as first:
        paused = first.post("/messages", json={"text": f"refund {order} 40"})
    assert paused.status_code == 202, paused.text
    [waiting_on] = paused.json()["waiting_on"]
    decided = f"/countersign/runs/{waiting_on['run_id']}/calls/{waiting_on['call_id']}/decided"
    reviewer.approve(held(reviewer, "issue_refund", {"order_id": order, "amount": 40.0}))
    with TestClient(started(gateway, tmp_path, monkeypatch).app) as second:
        answered = second.post(decided)

    assert answered.status_code == 200, answered.text
    answer = answered.json()["answer"]
    assert answer.startswith("issue_refund: ") and order in answer and "refunded" in answer
    assert not (tmp_path / "outbox.jsonl").exists()
