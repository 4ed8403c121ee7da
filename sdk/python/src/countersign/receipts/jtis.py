"""A receipt runs once, and a retry of the same request is recognised as one, as the Rust
verifier's jti stores have it (receipt/src/jtis.rs). The first use of a receipt's `jti`
records the `Idempotency-Key` of its request (empty when it had none) until the receipt could
no longer verify anyway. A later request with the same `jti` is `Seen.AGAIN` when it carries
that same, non-empty key (the worker sending the same call again after a crash, which the
tool answers as it answered the first time, running nothing twice); anything else is
`Seen.REUSED`, and refused.

A tool that may restart must remember across restarts: `MemoryJtis` forgets when its
process ends (tests only), `FileJtis` keeps them in a file on one host, and a store on
several hosts (Redis) is any class with `first_use` (`JtiStore`).
"""

from __future__ import annotations

import heapq
import json
import os
import threading
import time
from enum import Enum
from pathlib import Path
from typing import IO, Protocol


class Seen(Enum):
    """What a jti store knows of a receipt's `jti`."""

    FIRST = "first"
    """Not used before; now recorded."""
    AGAIN = "again"
    """Used before by a request with the same `Idempotency-Key`."""
    REUSED = "reused"
    """Used before by another request."""


class JtiStoreError(Exception):
    """The store could not answer; the receipt must not be taken as unused."""


class JtiStore(Protocol):
    """Remembers the receipts a tool has run."""

    def first_use(self, jti: str, idempotency_key: str, until: int) -> Seen:
        """Records `jti` as used by the request with `idempotency_key` ("" for none) unless
        it was used before; `until` (seconds since the epoch) is when the receipt no longer
        verifies, after which it need not be remembered. Raises `JtiStoreError` when it
        cannot tell."""
        ...


def used_before(recorded: str, idempotency_key: str) -> Seen:
    """A second use of a receipt whose first use was by the request with `recorded`."""
    if idempotency_key and recorded == idempotency_key:
        return Seen.AGAIN
    return Seen.REUSED


class _Remembered:
    """Receipts by `jti`, each with its first key and when it stops counting; dropped once
    expired, oldest first, as new ones come."""

    def __init__(self) -> None:
        self.by_jti: dict[str, tuple[str, int]] = {}
        self._by_expiry: list[tuple[int, str]] = []

    def forget_before(self, now: int) -> None:
        while self._by_expiry and self._by_expiry[0][0] < now:
            _, gone = heapq.heappop(self._by_expiry)
            self.by_jti.pop(gone, None)

    def seen(self, jti: str, idempotency_key: str) -> Seen | None:
        recorded = self.by_jti.get(jti)
        return used_before(recorded[0], idempotency_key) if recorded else None

    def record(self, jti: str, idempotency_key: str, until: int) -> None:
        if jti not in self.by_jti:
            self.by_jti[jti] = (idempotency_key, until)
            heapq.heappush(self._by_expiry, (until, jti))


class MemoryJtis:
    """`JtiStore` in memory, for one process that never restarts: a receipt it ran runs again
    after a restart. For tests; use `FileJtis` (or a shared store) for a tool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._remembered = _Remembered()

    def first_use(self, jti: str, idempotency_key: str, until: int) -> Seen:
        with self._lock:
            self._remembered.forget_before(int(time.time()))
            seen = self._remembered.seen(jti, idempotency_key)
            if seen is not None:
                return seen
            self._remembered.record(jti, idempotency_key, until)
            return Seen.FIRST


class FileJtis:
    """`JtiStore` in an append-only JSON lines file, one line per first use
    (`{"jti", "key", "until"}`, the Rust `FileJtis`'s format), for a tool on one host that
    must remember the receipts it ran across restarts.

    A use is answered `Seen.FIRST` only once its line is written and synced to disk, so a tool
    that crashes after running a receipt finds it on its next start; a line half written by
    a crash is a use that was never answered, and is dropped. Opening reads the file and,
    when some lines have expired (or one is torn), writes the rest to a new file that
    replaces it. One process only: two processes appending to one file do not see each
    other's uses.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        self._remembered = _Remembered()
        #: A failed write that could not be taken back may leave a torn line, after which
        #: nothing is appended; the store answers errors until it is opened again.
        self._broken = False
        lines, dropped = self._read()
        if dropped:
            self._rewrite(lines)
        for jti, key, until in lines:
            self._remembered.record(jti, key, until)
        # Open for the store's life, appended to on each first use; `close` closes it.
        self._file: IO[bytes] = open(self._path, "ab")  # noqa: SIM115
        # The file's name itself must survive a crash.
        _sync_folder(self._path.parent)

    def close(self) -> None:
        self._file.close()

    def first_use(self, jti: str, idempotency_key: str, until: int) -> Seen:
        with self._lock:
            self._remembered.forget_before(int(time.time()))
            seen = self._remembered.seen(jti, idempotency_key)
            if seen is not None:
                return seen
            if self._broken:
                raise JtiStoreError("an earlier write to the jti file failed; reopen it")
            self._append(_line(jti, idempotency_key, until))
            # Only once it is on disk: a use whose line may be lost is never answered FIRST.
            self._remembered.record(jti, idempotency_key, until)
            return Seen.FIRST

    def _append(self, line: bytes) -> None:
        before = self._file.tell()
        try:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as error:
            # Take back what part of the line was written, so the next one starts clean.
            try:
                self._file.truncate(before)
                self._file.flush()
                os.fsync(self._file.fileno())
            except OSError:
                self._broken = True
            raise JtiStoreError(f"cannot record a receipt in {self._path}: {error}") from error

    def _read(self) -> tuple[list[tuple[str, str, int]], bool]:
        """The lines still counting, and whether any were dropped (expired or torn)."""
        now = int(time.time())
        lines: list[tuple[str, str, int]] = []
        dropped = False
        try:
            with open(self._path, "rb") as file:
                for number, text in enumerate(file, start=1):
                    complete = text.endswith(b"\n")
                    try:
                        parsed = json.loads(text)
                        entry = (str(parsed["jti"]), str(parsed["key"]), int(parsed["until"]))
                    except (ValueError, KeyError, TypeError) as error:
                        if not complete:  # torn by a crash while it was written
                            dropped = True
                            continue
                        raise ValueError(f"{self._path} line {number}: {error}") from error
                    if complete and entry[2] >= now:
                        lines.append(entry)
                    else:
                        dropped = True
        except FileNotFoundError:
            pass
        return lines, dropped

    def _rewrite(self, lines: list[tuple[str, str, int]]) -> None:
        """Replaces the file with `lines`, atomically: a crash leaves the old file or the new."""
        fresh = self._path.with_name(self._path.name + ".new")
        with open(fresh, "wb") as file:
            file.writelines(_line(jti, key, until) for jti, key, until in lines)
            file.flush()
            os.fsync(file.fileno())
        os.replace(fresh, self._path)


def _line(jti: str, key: str, until: int) -> bytes:
    return json.dumps({"jti": jti, "key": key, "until": until}).encode() + b"\n"


def _sync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
