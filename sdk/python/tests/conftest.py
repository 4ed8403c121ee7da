"""The real system under test: one `countersign-local` (NATS, Redis, a gateway, a worker and
the demo refunds service) for the session, in a temporary folder, on ports of its own, with
one `external` agent, `desk`:

- `issue_refund` has an endpoint, the demo refunds service (which checks receipts itself):
  countersign runs it; refunds over $20 wait for a person.
- `send_email` has none, so it is released to the agent, and always waits for a person.
- `note_customer` has none and needs nobody: released to the agent at once.

A second agent, `desk-mcp`, is an MCP proxy (`/mcp/desk-mcp`) in front of the demo
service's MCP endpoint, for MCP clients countersign does not run: its `issue_refund` over $20
waits for a person. A third, `desk-ledger`, is one in front of a server written with the
official MCP Python SDK (`ledger_mcp`), started first: its read-only tools run at once, and
`write_off` waits for a person.

The support desk's key (`requester`) asks; yours (`admin`) decides, since nobody may
approve their own request.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import countersign

from .ledger_mcp import serving
from .support import AGENT, LEDGER_AGENT, MCP_AGENT

REPOSITORY = Path(__file__).resolve().parents[3]
REQUESTER_KEY = "local-requester-key-0000"
ADMIN_KEY = "local-demo-key-0000"

#: The runner's ports before its offset: gateway, worker probes, demo tools, NATS, Redis.
RUNNER_PORTS = (8080, 9090, 9100, 14222, 16379)
READY_WITHIN_SECS = 90.0
STOP_WITHIN_SECS = 30.0

AGENT_FILE = """\
name = "{agent}"

[model]
provider = "external"

[[tools]]
name = "issue_refund"
input_schema = {{ type = "object", properties = {{ order_id = {{ type = "string" }}, amount = {{ type = "number" }}, reason = {{ type = "string" }} }}, required = ["order_id", "amount"] }}
http = {{ url = "http://127.0.0.1:{tools_port}/refunds" }}
[tools.approval]
when = "input.amount > 20.0"
reason = "Refund of ${{{{ input.amount }}}} moves money"

[[tools]]
name = "send_email"
input_schema = {{ type = "object", properties = {{ to = {{ type = "string" }}, body = {{ type = "string" }}, meta = {{ type = "object" }} }}, required = ["to", "body"] }}
[tools.approval]
reason = "Email leaves the company"

[[tools]]
name = "note_customer"
input_schema = {{ type = "object", properties = {{ customer = {{ type = "string" }}, note = {{ type = "string" }} }}, required = ["customer", "note"] }}
approval = "never"
"""


MCP_AGENT_FILE = """\
name = "{agent}"

[model]
provider = "mcp_client"

[[mcp_servers]]
name = "shop"
url = "http://127.0.0.1:{tools_port}/mcp"
trusted = true

[[tools]]
name = "issue_refund"
mcp = "shop"
idempotent = true
[tools.approval]
when = "input.amount > 20.0"
reason = "Refund of ${{{{ input.amount }}}} moves money"
"""


LEDGER_AGENT_FILE = """\
name = "{agent}"

[model]
provider = "mcp_client"

[[mcp_servers]]
name = "ledger"
url = "{url}"
trusted = true
"""


@dataclass(frozen=True)
class Gateway:
    """Where the session's countersign answers, and where its runner logs."""

    url: str
    log: Path

    @property
    def jwks_url(self) -> str:
        return f"{self.url}/.well-known/jwks.json"

    def client(self, key: str = REQUESTER_KEY) -> countersign.Client:
        return countersign.Client(self.url, key)

    def async_client(self, key: str = REQUESTER_KEY) -> countersign.AsyncClient:
        return countersign.AsyncClient(self.url, key)


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_offset() -> int:
    """An offset whose five ports are all free now, away from the default runner's."""
    for offset in range(1300, 40000, 100):
        if all(_free(port + offset) for port in RUNNER_PORTS):
            return offset
    raise RuntimeError("no free port offset for countersign-local")


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_ready(process: subprocess.Popen[bytes], gateway: Gateway) -> None:
    """Until the runner says it is running (it does once the gateway and the worker both
    answer ready) and the gateway answers ready; fails at once if the runner stops."""
    deadline = time.monotonic() + READY_WITHIN_SECS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"countersign-local exited ({process.returncode}):\n{_tail(gateway.log)}"
            )
        if "countersign is running" in gateway.log.read_text(errors="replace"):
            try:
                if httpx.get(f"{gateway.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    raise RuntimeError(
        f"countersign-local not ready in {READY_WITHIN_SECS}s:\n{_tail(gateway.log)}"
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C's signal first, which stops every part in order; the runner's own process group
    (it and the servers it started) is killed only if that does not end it."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=STOP_WITHIN_SECS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="session")
def ledger() -> Iterator[str]:
    """The MCP endpoint of the ledger, a server written with the official MCP Python SDK."""
    with serving() as url:
        yield url


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory, ledger: str) -> Iterator[Gateway]:
    binaries = Path(os.environ.get("COUNTERSIGN_BIN_DIR", REPOSITORY / "target" / "debug"))
    runner = binaries / "countersign-local"
    if not runner.is_file():
        pytest.fail(f"{runner} is missing: build it (cargo build -p countersign-local)")
    home = tmp_path_factory.mktemp("countersign")
    offset = _free_offset()
    agents = home / "agents"
    agents.mkdir()
    (agents / f"{AGENT}.toml").write_text(AGENT_FILE.format(agent=AGENT, tools_port=9100 + offset))
    (agents / f"{MCP_AGENT}.toml").write_text(
        MCP_AGENT_FILE.format(agent=MCP_AGENT, tools_port=9100 + offset)
    )
    (agents / f"{LEDGER_AGENT}.toml").write_text(
        LEDGER_AGENT_FILE.format(agent=LEDGER_AGENT, url=ledger)
    )
    log = home / "countersign-local.log"
    env = {
        key: value
        for key, value in os.environ.items()
        # The scripted model, whatever the developer's shell has: no agent here has a model.
        if key not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "NATS_URL", "REDIS_URL")
    }
    env.update(
        COUNTERSIGN_LOCAL_AGENTS=str(agents),
        COUNTERSIGN_LOCAL_PORT_OFFSET=str(offset),
        # The runner keeps its data beside the repository unless told otherwise.
        COUNTERSIGN_LOCAL_DIR=str(home / ".countersign"),
    )
    gateway = Gateway(
        url=f"http://127.0.0.1:{8080 + offset}",
        log=log,
    )
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [str(runner)],
            cwd=home,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        _wait_ready(process, gateway)
        yield gateway
    finally:
        _stop(process)


@pytest.fixture
def client(gateway: Gateway) -> Iterator[countersign.Client]:
    """The support desk's client: it asks."""
    with gateway.client(REQUESTER_KEY) as requester:
        yield requester


@pytest.fixture
def reviewer(gateway: Gateway) -> Iterator[countersign.Client]:
    """Your client: you decide."""
    with gateway.client(ADMIN_KEY) as admin:
        yield admin


@pytest.fixture
def key() -> Callable[[], str]:
    """Fresh idempotency keys: each ask of a test is its own call unless it means otherwise."""
    return lambda: f"test-{uuid.uuid4()}"
