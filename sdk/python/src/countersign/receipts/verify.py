"""A tool's check of a receipt against the request it came with, step for step as the Rust
verifier makes it (receipt/src/verify.rs): signed by a published key (EdDSA), issued by the
expected gateway, for this tool (`aud` and `tool`), not expired (30 s of leeway for clocks),
sent under exactly its call's `Idempotency-Key` (`RUN:TURN:CALL`, byte for byte), for
exactly this body (the RFC 8785 digest), and not used before by another request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jwt

from .digest import body_digest
from .jtis import JtiStore, JtiStoreError, Seen
from .keys import Jwks, KeysError
from .refusals import (
    BadSignature,
    Expired,
    InputChanged,
    JtiStoreUnavailable,
    KeysUnavailable,
    Malformed,
    Missing,
    ModelApproved,
    OtherCall,
    OtherIssuer,
    OtherTool,
    Reused,
    UnknownKey,
)

#: How far clocks may disagree, in seconds.
LEEWAY_SECS = 30

#: The prefix of the name a reviewer model approves in, in `decided_by`; no person has it.
MODEL_PREFIX = "model:"

#: The header the worker sends a call's receipt in.
RECEIPT_HEADER = "Countersign-Receipt"


@dataclass(frozen=True)
class Claims:
    """What a receipt says (docs/security.md "Checking a receipt in your tool")."""

    iss: str
    aud: str
    iat: int
    exp: int
    jti: str
    run_id: str
    turn: int
    call_id: str
    tool: str
    input_digest: str
    action: str
    """`approve` or `edit`."""
    decided_by: tuple[str, ...]
    policy_version: str
    grant: str | None = None
    """The standing grant the call was approved under, when nobody was asked."""

    @property
    def idempotency_key(self) -> str:
        """The `Idempotency-Key` the call is sent with and the receipt spent under:
        `RUN:TURN:CALL`, the turn in decimal without leading zeros, as workers send it."""
        return f"{self.run_id}:{self.turn}:{self.call_id}"

    @property
    def approved_by_model(self) -> bool:
        """Whether a reviewer model approved the call (`decided_by` names
        `model:NAME@POLICY_VERSION`): what a verifier made with `people_only` refuses."""
        return any(who.startswith(MODEL_PREFIX) for who in self.decided_by)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Claims:
        """The claims, or `Malformed` when one is missing or of the wrong type."""

        def claim(name: str, kind: type) -> Any:
            value = data.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise Malformed(f"the claim {name} is missing or not a {kind.__name__}")
            return value

        decided_by = claim("decided_by", list)
        if not all(isinstance(who, str) for who in decided_by):
            raise Malformed("the claim decided_by is not a list of names")
        grant = data.get("grant")
        if grant is not None and not isinstance(grant, str):
            raise Malformed("the claim grant is not a str")
        turn = claim("turn", int)
        if turn < 0:
            raise Malformed("the claim turn is negative")
        return cls(
            iss=claim("iss", str),
            aud=claim("aud", str),
            iat=claim("iat", int),
            exp=claim("exp", int),
            jti=claim("jti", str),
            run_id=claim("run_id", str),
            turn=turn,
            call_id=claim("call_id", str),
            tool=claim("tool", str),
            input_digest=claim("input_digest", str),
            action=claim("action", str),
            decided_by=tuple(decided_by),
            policy_version=claim("policy_version", str),
            grant=grant,
        )


@dataclass(frozen=True)
class Checked:
    """A receipt that lets its call run."""

    claims: Claims
    again: bool
    """The receipt was let through before for a request with the same `Idempotency-Key`:
    answer as that request was answered, and run nothing again."""


class Verifier:
    """What a tool checks receipts with: the gateway's keys, who the tool expects receipts
    from (`issuer`, the gateway's public base URL) and for (`audience`, the tool's `audience`
    in the agent file, else its name), and the receipts it has run (`jti_store`).

    `keys` is the gateway's JWK Set URL (`https://gateway/.well-known/jwks.json`), a JWK Set
    as a dict, or a `Jwks`. `check` blocks (it may fetch keys and sync a file): from async
    code, run it in a thread, as `countersign.fastapi` does. With `people_only`, a call a
    reviewer model approved is refused (`ModelApproved`), whatever an agent's policy lets a
    model do.
    """

    def __init__(
        self,
        keys: str | Mapping[str, Any] | Jwks,
        audience: str,
        issuer: str,
        jti_store: JtiStore,
        *,
        people_only: bool = False,
    ) -> None:
        if isinstance(keys, Jwks):
            self.keys = keys
        elif isinstance(keys, str):
            self.keys = Jwks(keys)
        else:
            self.keys = Jwks.fixed(keys)
        self.audience = audience
        self.issuer = issuer
        self.jti_store = jti_store
        self.people_only = people_only

    def check(
        self,
        receipt: str | None,
        *,
        tool: str,
        idempotency_key: str | None,
        body: bytes,
    ) -> Checked:
        """Checks `receipt`, the one a request came with, for a call of `tool` (its name in
        the agent file) whose JSON body is `body`, sent with `idempotency_key`; raises the
        `Refusal` that says why not. A receipt refused for any reason is not spent."""
        if receipt is None:
            raise Missing()
        kid = _kid_of(receipt)
        try:
            key = self.keys.find(kid)
        except KeysError as error:
            raise KeysUnavailable(str(error)) from error
        if key is None:
            raise UnknownKey(kid)
        claims = self._signed_claims(receipt, key)
        if claims.tool != tool:
            raise OtherTool()
        if self.people_only and claims.approved_by_model:
            raise ModelApproved()
        # Byte for byte: a key naming the call another way (`RUN:01:CALL`, another turn) is
        # another request, which would spend the receipt before the worker's own call.
        if idempotency_key is None or idempotency_key != claims.idempotency_key:
            raise OtherCall()
        if body_digest(body) != claims.input_digest:
            raise InputChanged()
        # Last, so that a receipt refused for anything else is not spent. Remembered for a
        # leeway past the last second this tool accepts it, as another instance's clock may
        # be behind this one's by as much.
        until = claims.exp + 2 * LEEWAY_SECS
        try:
            seen = self.jti_store.first_use(claims.jti, idempotency_key, until)
        except JtiStoreError as error:
            raise JtiStoreUnavailable(str(error)) from error
        if seen is Seen.REUSED:
            raise Reused()
        return Checked(claims=claims, again=seen is Seen.AGAIN)

    def _signed_claims(self, receipt: str, key: jwt.PyJWK) -> Claims:
        """The claims of `receipt` if `key` signed it, for this gateway and tool, unexpired."""
        try:
            payload = jwt.decode(
                receipt,
                key.key,
                algorithms=["EdDSA"],
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY_SECS,
                # As the Rust verifier: `iat` and `nbf` say nothing a tool acts on, and a
                # tool whose clock is behind the gateway's must not refuse a fresh receipt.
                options={
                    "require": ["exp", "iss", "aud"],
                    "verify_iat": False,
                    "verify_nbf": False,
                },
            )
        except jwt.InvalidSignatureError:
            raise BadSignature() from None
        except jwt.ExpiredSignatureError:
            raise Expired() from None
        except jwt.InvalidIssuerError:
            raise OtherIssuer() from None
        except jwt.InvalidAudienceError:
            raise OtherTool() from None
        except jwt.PyJWTError as error:
            raise Malformed(str(error)) from None
        return Claims.from_json(payload)


def _kid_of(receipt: str) -> str:
    """The `kid` of an EdDSA receipt's header."""
    try:
        header = jwt.get_unverified_header(receipt)
    except jwt.PyJWTError as error:
        raise Malformed(str(error)) from None
    if header.get("alg") != "EdDSA":
        raise Malformed(f"alg {header.get('alg')!r} is not EdDSA")
    kid = header.get("kid")
    if not isinstance(kid, str):
        raise Malformed("the header names no kid")
    return kid
