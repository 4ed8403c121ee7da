"""Each reason a receipt is refused, with receipts signed here by a key of the test's own (the
gateway's are checked in test_door and test_fastapi), and the jti stores."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt.algorithms import OKPAlgorithm

from countersign.receipts import (
    BadSignature,
    Expired,
    FileJtis,
    InexactNumber,
    InputChanged,
    JtiStoreError,
    JtiStoreUnavailable,
    Jwks,
    KeysError,
    KeysUnavailable,
    Malformed,
    MemoryJtis,
    Missing,
    ModelApproved,
    OtherCall,
    OtherIssuer,
    OtherTool,
    Refusal,
    Reused,
    Seen,
    UnknownKey,
    Verifier,
    has_inexact_integer,
    input_digest,
)

ISSUER = "https://approvals.example.com"
INPUT = {"order_id": "A-1001", "amount": 40}
BODY = json.dumps(INPUT).encode()
KEY = "run_1:2:call_1"


class Gateway:
    """Signs receipts as the gateway does, with a key of its own."""

    def __init__(self, kid: str = "k1") -> None:
        self.kid = kid
        self.key = Ed25519PrivateKey.generate()

    def jwks(self) -> dict[str, Any]:
        jwk = OKPAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        return {"keys": [{**jwk, "kid": self.kid, "alg": "EdDSA", "use": "sig"}]}

    def receipt(self, **changes: Any) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "aud": "issue_refund",
            "iat": now,
            "exp": now + 3600,
            "jti": "rct_1",
            "run_id": "run_1",
            "turn": 2,
            "call_id": "call_1",
            "tool": "issue_refund",
            "input_digest": input_digest(INPUT),
            "action": "approve",
            "decided_by": ["rita"],
            "policy_version": "v1",
        }
        headers = {"kid": changes.pop("kid", self.kid)}
        claims.update(changes)
        claims = {name: value for name, value in claims.items() if value is not None}
        return jwt.encode(claims, self.key, algorithm="EdDSA", headers=headers)


@pytest.fixture
def gateway() -> Gateway:
    return Gateway()


@pytest.fixture
def check(gateway: Gateway) -> Callable[..., Any]:
    verifier = Verifier(gateway.jwks(), "issue_refund", ISSUER, MemoryJtis())

    def check(receipt: str | None, key: str | None = KEY, body: bytes = BODY) -> Any:
        return verifier.check(receipt, tool="issue_refund", idempotency_key=key, body=body)

    return check


def test_a_receipt_for_this_call_and_input_is_accepted_once_and_recognised_again(
    gateway: Gateway, check: Callable[..., Any]
) -> None:
    receipt = gateway.receipt()

    first = check(receipt, body=b'{ "amount": 40.0, "order_id": "A-1001" }')
    again = check(receipt)

    assert (first.again, again.again) == (False, True)
    assert first.claims.idempotency_key == KEY
    assert (first.claims.decided_by, first.claims.grant) == (("rita",), None)


def test_a_receipt_signed_by_a_clock_ahead_of_the_tools_is_accepted(
    gateway: Gateway, check: Callable[..., Any]
) -> None:
    ahead = int(time.time()) + 600

    checked = check(gateway.receipt(iat=ahead, nbf=ahead, exp=ahead + 3600))

    assert checked.claims.iat == ahead


@pytest.mark.parametrize(
    ("refusal", "code", "make"),
    [
        (Missing, "missing", lambda g: (None, KEY, BODY)),
        (Malformed, "malformed", lambda g: ("not.a.jwt", KEY, BODY)),
        (Malformed, "malformed", lambda g: (g.receipt(turn=None), KEY, BODY)),
        (UnknownKey, "unknown_key", lambda g: (g.receipt(kid="k9"), KEY, BODY)),
        (BadSignature, "bad_signature", lambda g: (Gateway("k1").receipt(), KEY, BODY)),
        (OtherIssuer, "other_issuer", lambda g: (g.receipt(iss="https://evil"), KEY, BODY)),
        (OtherTool, "other_tool", lambda g: (g.receipt(aud="send_email"), KEY, BODY)),
        (OtherTool, "other_tool", lambda g: (g.receipt(tool="send_email"), KEY, BODY)),
        (OtherCall, "other_call", lambda g: (g.receipt(), "run_1:02:call_1", BODY)),
        (OtherCall, "other_call", lambda g: (g.receipt(), None, BODY)),
        (Expired, "expired", lambda g: (g.receipt(exp=int(time.time()) - 120), KEY, BODY)),
        (
            InputChanged,
            "input_changed",
            lambda g: (g.receipt(), KEY, b'{"order_id":"A-1001","amount":41}'),
        ),
        (InputChanged, "input_changed", lambda g: (g.receipt(), KEY, b"not json")),
        (InputChanged, "input_changed", lambda g: (g.receipt(), KEY, b'{"amount": NaN}')),
        (
            InexactNumber,
            "inexact_number",
            lambda g: (g.receipt(), KEY, b'{"order_id":"A-1001","amount":9007199254740993}'),
        ),
    ],
)
def test_each_refusal_has_the_rust_verifiers_code(
    gateway: Gateway,
    check: Callable[..., Any],
    refusal: type[Refusal],
    code: str,
    make: Callable[[Gateway], tuple[str | None, str | None, bytes]],
) -> None:
    receipt, key, body = make(gateway)

    with pytest.raises(refusal) as refused:
        check(receipt, key, body)

    assert (refused.value.code, refused.value.status) == (code, 401)


def test_a_tool_that_takes_only_peoples_approvals_refuses_a_models_unspent(
    gateway: Gateway,
) -> None:
    jtis = MemoryJtis()
    strict = Verifier(gateway.jwks(), "issue_refund", ISSUER, jtis, people_only=True)
    by_model = gateway.receipt(decided_by=["model:claude-haiku@3f2a9c1d0b4e5f60"])

    with pytest.raises(ModelApproved) as refused:
        strict.check(by_model, tool="issue_refund", idempotency_key=KEY, body=BODY)

    assert (refused.value.code, refused.value.status) == ("model_approved", 401)
    # Not spent: a verifier on the same store that takes models' approvals runs it first.
    lenient = Verifier(gateway.jwks(), "issue_refund", ISSUER, jtis)
    checked = lenient.check(by_model, tool="issue_refund", idempotency_key=KEY, body=BODY)
    assert (checked.again, checked.claims.approved_by_model) == (False, True)
    person = strict.check(
        gateway.receipt(jti="rct_2"), tool="issue_refund", idempotency_key=KEY, body=BODY
    )
    assert not person.claims.approved_by_model


def test_a_refused_receipt_is_not_spent(gateway: Gateway, check: Callable[..., Any]) -> None:
    receipt = gateway.receipt()
    with pytest.raises(InputChanged):
        check(receipt, body=b'{"order_id":"A-1001","amount":41}')

    assert check(receipt).again is False


def test_a_receipt_whose_first_use_was_another_request_is_reused(gateway: Gateway) -> None:
    jtis = MemoryJtis()
    jtis.first_use("rct_1", "", int(time.time()) + 3600)  # used before, without a key
    verifier = Verifier(gateway.jwks(), "issue_refund", ISSUER, jtis)

    with pytest.raises(Reused) as refused:
        verifier.check(gateway.receipt(), tool="issue_refund", idempotency_key=KEY, body=BODY)

    assert refused.value.code == "reused"


def test_what_cannot_be_checked_now_is_a_503(gateway: Gateway) -> None:
    class Broken:
        def first_use(self, jti: str, idempotency_key: str, until: int) -> Seen:
            raise JtiStoreError("redis is down")

    no_store = Verifier(gateway.jwks(), "issue_refund", ISSUER, Broken())
    no_keys = Verifier("http://127.0.0.1:9/jwks.json", "issue_refund", ISSUER, MemoryJtis())

    with pytest.raises(JtiStoreUnavailable) as store:
        no_store.check(gateway.receipt(), tool="issue_refund", idempotency_key=KEY, body=BODY)
    with pytest.raises(KeysUnavailable) as keys:
        no_keys.check(gateway.receipt(), tool="issue_refund", idempotency_key=KEY, body=BODY)

    assert (store.value.status, store.value.detail) == (503, "redis is down")
    assert keys.value.status == 503 and "redis" not in str(keys.value)


def test_keys_are_fetched_again_for_an_unknown_kid_at_most_once_per_interval() -> None:
    now = [0.0]
    published = [Gateway("k1")]
    fetches: list[str] = []

    def serve(request: httpx.Request) -> httpx.Response:
        fetches.append(str(request.url))
        keys = [k for g in published for k in g.jwks()["keys"]]
        return httpx.Response(200, json={"keys": keys})

    http = httpx.Client(transport=httpx.MockTransport(serve))
    jwks = Jwks("https://gw/jwks", min_interval=10, max_age=300, http=http, clock=lambda: now[0])

    assert jwks.find("k1") is not None
    assert jwks.find("k2") is None  # not fetched again so soon: an unknown kid is unknown
    assert len(fetches) == 1
    published.append(Gateway("k2"))  # the gateway rotates
    now[0] = 11
    assert jwks.find("k2") is not None
    assert len(fetches) == 2
    now[0] = 400  # past max_age: fetched again even for a known kid
    assert jwks.find("k1") is not None
    assert len(fetches) == 3


def test_keys_past_their_age_that_cannot_be_fetched_are_not_used() -> None:
    now = [0.0]
    up = [True]

    def serve(request: httpx.Request) -> httpx.Response:
        if not up[0]:
            return httpx.Response(503)
        return httpx.Response(200, json=Gateway("k1").jwks())

    http = httpx.Client(transport=httpx.MockTransport(serve))
    jwks = Jwks("https://gw/jwks", min_interval=10, max_age=300, http=http, clock=lambda: now[0])
    assert jwks.find("k1") is not None
    up[0] = False

    now[0] = 299
    assert jwks.find("k1") is not None  # still fresh: the copy is used
    now[0] = 301
    with pytest.raises(KeysError):
        jwks.find("k1")


def test_integers_past_two_to_the_53_are_found_in_the_text() -> None:
    for body in (
        b'{"a": 9007199254740992}',
        b'{"a": -9007199254740993}',
        b'[1, {"b": 18446744073709551616}]',
        b'{"a": 123456789012345678901234567890123456789012}',
    ):
        assert has_inexact_integer(body), body
    for body in (
        b'{"a": 9007199254740991, "b": -9007199254740991}',
        b'{"a": 1e300, "b": 90071992547409930.5, "c": 9007199254740993e0}',
        b'{"a": "9007199254740993", "b\\"": "x\\"9007199254740993"}',
    ):
        assert not has_inexact_integer(body), body


def test_the_file_store_remembers_across_restarts_and_drops_what_expired(tmp_path: Path) -> None:
    path = tmp_path / "receipts-run.jsonl"
    later = int(time.time()) + 3600
    store = FileJtis(path)
    assert store.first_use("rct_1", KEY, later) is Seen.FIRST
    assert store.first_use("rct_2", "k2", int(time.time()) - 1) is Seen.FIRST
    store.close()
    with open(path, "ab") as file:
        file.write(b'{"jti": "rct_3", "key": "k3", "un')  # torn by a crash mid-write

    reopened = FileJtis(path)

    assert reopened.first_use("rct_1", KEY, later) is Seen.AGAIN
    assert reopened.first_use("rct_1", "another", later) is Seen.REUSED
    assert reopened.first_use("rct_3", "k3", later) is Seen.FIRST  # its use was never answered
    reopened.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["jti"] for line in lines] == ["rct_1", "rct_3"]


def test_a_file_store_line_is_the_rust_stores_line(tmp_path: Path) -> None:
    path = tmp_path / "receipts-run.jsonl"
    path.write_text('{"jti":"rct_9","key":"run_1:2:call_1","until":4102444800}\n')

    store = FileJtis(path)

    assert store.first_use("rct_9", "run_1:2:call_1", 4102444800) is Seen.AGAIN
    store.close()
