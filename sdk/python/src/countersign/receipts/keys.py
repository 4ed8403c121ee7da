"""The gateway's published keys as a tool holds them: a fixed JWK Set, or one fetched from the
gateway's `GET /.well-known/jwks.json`, the current signing key first and then the retired
ones still accepted. It follows the Rust verifier's `Jwks` (receipt/src/jwks.rs):

- fetched again when a receipt names a key the copy lacks (the gateway rotated), and when
  the copy is older than `max_age` (so a key the gateway stopped publishing stops verifying
  here too);
- at most one fetch per `min_interval` started by lookups, however many receipts name keys
  nobody published, so forged tokens cannot make a tool hammer the gateway;
- a copy past `max_age` that cannot be refreshed is not used: receipts are refused as
  uncheckable (`KeysUnavailable`, 503) until a fetch succeeds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import jwt

log = logging.getLogger("countersign.receipts")

#: How long one fetch of the key set may take, in seconds.
FETCH_TIMEOUT = 5.0


class KeysError(Exception):
    """The key set is out of date and could not be fetched."""


def parse_key_set(jwks: Mapping[str, Any]) -> dict[str, jwt.PyJWK]:
    """The keys of a JWK Set by `kid`; keys without one, or that PyJWT cannot use, are
    skipped, as a receipt signed with them could not be checked anyway."""
    keys: dict[str, jwt.PyJWK] = {}
    for jwk in jwks.get("keys", ()):
        kid = jwk.get("kid") if isinstance(jwk, Mapping) else None
        if not isinstance(kid, str) or kid in keys:
            continue
        try:
            keys[kid] = jwt.PyJWK(dict(jwk))
        except jwt.PyJWTError as error:
            log.warning("skipping published key %r: %s", kid, error)
    return keys


class Jwks:
    """The keys receipts are checked with. `Jwks(url)` follows the gateway's published set;
    `Jwks.fixed(set)` never changes."""

    def __init__(
        self,
        url: str | None,
        *,
        min_interval: float = 10.0,
        max_age: float = 300.0,
        http: httpx.Client | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._min_interval = min_interval
        self._max_age = max_age
        self._http = http
        self._clock = clock
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched: float | None = None
        #: Held while fetching, so that one fetch runs at a time.
        self._fetching = threading.Lock()
        self._last_started: float | None = None

    @classmethod
    def fixed(cls, jwks: Mapping[str, Any]) -> Jwks:
        keys = cls(None)
        keys._keys = parse_key_set(jwks)
        return keys

    def find(self, kid: str) -> jwt.PyJWK | None:
        """The published key `kid`, or None if it is not published; raises `KeysError` when
        the copy is out of date and cannot be fetched."""
        if self._url is None:
            return self._keys.get(kid)
        seen = self._fetched
        if self._fresh(seen) and kid in self._keys:
            return self._keys[kid]
        try:
            self._fetch_for_lookup(seen)
        except KeysError:
            # Unfetched is fine while the copy is fresh: the kid is simply unknown.
            if not self._fresh(self._fetched):
                raise
        return self._keys.get(kid)

    def refresh(self) -> None:
        """Fetches the key set now, whenever it was last fetched."""
        if self._url is not None:
            with self._fetching:
                self._fetch()

    def _fresh(self, fetched: float | None) -> bool:
        return fetched is not None and self._clock() - fetched < self._max_age

    def _fetch_for_lookup(self, seen: float | None) -> None:
        with self._fetching:
            if self._fetched != seen:
                return  # another lookup fetched while this one waited for the lock
            if self._last_started is not None:
                since = self._clock() - self._last_started
                if since < self._min_interval:
                    raise KeysError(
                        "the key set is out of date and was last fetched, without success, "
                        f"{since:.1f}s ago"
                    )
            self._fetch()

    def _fetch(self) -> None:
        assert self._url is not None
        if self._http is None:
            self._http = httpx.Client(timeout=FETCH_TIMEOUT)
        self._last_started = self._clock()
        try:
            response = self._http.get(self._url, timeout=FETCH_TIMEOUT)
            response.raise_for_status()
            keys = parse_key_set(response.json())
        except (httpx.HTTPError, ValueError, AttributeError) as error:
            log.warning("cannot fetch the receipt key set from %s: %s", self._url, error)
            raise KeysError(f"cannot fetch the key set from {self._url}: {error}") from error
        self._keys = keys
        self._fetched = self._clock()
