"""Following a run's live events: the wire format read in pieces cut anywhere, and a follow
whose connection drops after its first event, which resumes from `Last-Event-ID` with
nothing lost or repeated."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx

from countersign import Client, Event
from countersign.events import Message, SseDecoder

from .conftest import REQUESTER_KEY, Gateway
from .support import AGENT


def test_the_decoder_reads_events_cut_anywhere_with_any_line_ending() -> None:
    wire = (
        ": heartbeat\r\n"
        'id: 1\r\nevent: turn.started\r\ndata: {"seq":1}\r\n\r\n'
        "id: 2\revent: text.delta\rdata: line one\rdata:line two\r\r"
        "retry: 1500\nid: 3\nevent: run.completed\ndata: {}\n\n"
        'event: stream.cut\ndata: {"reason":"slow"}\n\n'
    )
    expected = [
        Message("turn.started", '{"seq":1}', "1"),
        Message("text.delta", "line one\nline two", "2"),
        Message("run.completed", "{}", "3", retry_ms=1500),
        Message("stream.cut", '{"reason":"slow"}', None),
    ]
    for size in (1, 2, 3, 7, len(wire)):
        decoder = SseDecoder()
        messages = [m for i in range(0, len(wire), size) for m in decoder.feed(wire[i : i + size])]
        assert messages == expected, size


def test_an_event_without_data_is_not_dispatched() -> None:
    decoder = SseDecoder()
    assert decoder.feed("id: 9\nevent: nothing\n\n: only a comment\n\n") == []
    assert decoder.feed("data: x\n\n") == [Message("message", "x", None)]


class CutAfterFirstEvent(httpx.BaseTransport):
    """A transport that ends the first events stream it carries right after its first
    event, as a dropped connection would, and keeps every request it sent."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.requests: list[httpx.Request] = []
        self.cut = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        response = self.inner.handle_request(request)
        if self.cut or not request.url.path.endswith("/events") or response.status_code != 200:
            return response
        self.cut = True
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(200, headers=response.headers, stream=FirstEventOnly(response.stream))

    def close(self) -> None:
        self.inner.close()


class FirstEventOnly(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[bytes]:
        seen = b""
        for chunk in self.inner:
            seen += chunk
            end = seen.find(b"\n\n")
            if end >= 0:
                yield seen[: end + 2]
                return
        yield seen

    def close(self) -> None:
        self.inner.close()


def ended_run(client: Client, key: str) -> str:
    """A run of a call the policy let through, ended by the time this returns."""
    call = client.ask(
        AGENT, "issue_refund", {"order_id": "A-1002", "amount": 15.5}, idempotency_key=key
    )
    assert call.outcome_reached, call
    # The call's outcome comes before the run's end; following the run waits for its end.
    events = list(client.events(call.run_id))
    assert events[-1].type == "run.completed", [e.type for e in events]
    return call.run_id


def test_a_dropped_stream_resumes_from_the_last_event_id_losing_and_repeating_nothing(
    gateway: Gateway, client: Client, key: Callable[[], str]
) -> None:
    run_id = ended_run(client, key())
    whole = list(client.events(run_id))
    transport = CutAfterFirstEvent()

    with Client(gateway.url, REQUESTER_KEY, transport=transport) as cut:
        followed = list(cut.events(run_id))

    assert transport.cut
    streams = [r for r in transport.requests if r.url.path.endswith("/events")]
    assert [r.headers.get("last-event-id") for r in streams] == [None, "1"]
    assert [(e.seq, e.type) for e in followed] == [(e.seq, e.type) for e in whole]
    assert [e.seq for e in followed] == list(range(1, len(whole) + 1))
    assert [e.type for e in whole][:2] == ["turn.started", "tool.call"]
    assert whole[-1].type == "run.completed" and whole[-1].ends_run


def test_following_after_the_last_event_of_an_ended_run_yields_nothing(
    client: Client, key: Callable[[], str]
) -> None:
    run_id = ended_run(client, key())
    whole = list(client.events(run_id))

    assert list(client.events(run_id, after=whole[-1].seq)) == []
    rest: list[Event] = list(client.events(run_id, after=2))
    assert [e.seq for e in rest] == [e.seq for e in whole[2:]]


def test_events_carry_the_runs_data(client: Client, key: Callable[[], str]) -> None:
    run_id = ended_run(client, key())

    events = {e.type: e for e in client.events(run_id)}

    call = events["tool.call"].data
    assert (call["run_id"], call["tool"], call["disposition"]) == (run_id, "issue_refund", "run")
    result = events["tool.result"].data
    assert (result["outcome"], result["is_error"]) == ("executed", False)
