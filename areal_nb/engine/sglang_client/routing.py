"""Which of `SGLangEngine`'s servers a request goes to, and which servers are still in use.

A request whose prompt extends the exact tokens (prompt + output) of a request this engine
finished earlier goes to the server that produced them, so the server's prefix cache holds the
conversation so far; any other request (a new conversation, or a turn whose prompt was
re-rendered) goes to the live server with the fewest requests in flight. The table of finished
sequences is an LRU of `max_tracked_sequences` entries keyed by (length, hash of the tokens).
A server marked down (`mark_down`) is never routed to again: a restarted server could serve
other weights.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from areal_nb.errors import ServerDownError


@dataclass(eq=False)
class Server:
    url: str
    index: int
    in_flight: int = 0
    assigned: int = 0
    down: str | None = None  # why it was taken out
    tasks: set[asyncio.Task] = field(default_factory=set)


class PrefixTable:
    """LRU of finished token sequences → the server that holds them in its prefix cache."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._table: collections.OrderedDict[tuple[int, int], Server] = collections.OrderedDict()
        self._lengths: collections.Counter[int] = collections.Counter()

    def remember(self, tokens: Sequence[int], server: Server) -> None:
        key = (len(tokens), hash(tuple(tokens)))
        if key in self._table:
            self._table.move_to_end(key)
        else:
            self._lengths[key[0]] += 1
        self._table[key] = server
        while len(self._table) > self.max_entries:
            (length, _), _ = self._table.popitem(last=False)
            self._lengths[length] -= 1
            if not self._lengths[length]:
                del self._lengths[length]

    def lookup(self, prompt: Sequence[int]) -> Server | None:
        """The server of the longest remembered sequence that is a strict prefix of `prompt`."""
        for length in sorted((n for n in self._lengths if n < len(prompt)), reverse=True):
            server = self._table.get((length, hash(tuple(prompt[:length]))))
            if server is not None and server.down is None:
                return server
        return None


class ServerPool:
    """The servers of one engine: `route` picks one for a prompt; `live` lists those in use."""

    def __init__(self, addresses: Sequence[str], max_tracked_sequences: int) -> None:
        self.servers = [Server(url=normalize_url(u), index=i) for i, u in enumerate(addresses)]
        self.prefixes = PrefixTable(max_tracked_sequences)
        self._tie_break = itertools.count()

    def live(self) -> list[Server]:
        return [s for s in self.servers if s.down is None]

    def none_left(self) -> ServerDownError:
        reasons = "; ".join(f"{s.url}: {s.down}" for s in self.servers)
        return ServerDownError(f"no live engine server left ({reasons})")

    def route(self, prompt: Sequence[int]) -> Server:
        live = self.live()
        if not live:
            raise self.none_left()
        server = self.prefixes.lookup(prompt)
        if server is None:
            server = min(live, key=lambda s: (s.in_flight, s.assigned, next(self._tie_break)))
        server.assigned += 1
        return server


def mark_down(server: Server, reason: str) -> None:
    """Take `server` out for good (the first reason is kept)."""
    if server.down is None:
        server.down = reason


def server_rid(prefix: str, n: int) -> str:
    """The n-th server-side request id: `prefix` and n in 16 hex digits, so every id has one length
    and none is a prefix of another (SGLang aborts every request whose rid starts with the one
    named: with `p-1`, aborting `p-1` would also abort `p-10` ... `p-19`, `p-100` ...)."""
    return f"{prefix}-{n:016x}"


def normalize_url(address: str) -> str:
    address = address.strip().rstrip("/")
    return address if "://" in address else f"http://{address}"
