"""`PrefixCache`: the KV of finished sequences, kept so that a prompt continuing one prefills only
its new tokens (a multi-turn agent's next turn is its previous prompt + reply + a new message).

An entry is the exact token sequence a finished row held in the KV cache (its prompt and every
output token but the last, which was sampled and never fed) with that row's keys and values, one
[kv_heads, n, head_dim] pair per layer, unpadded. A prompt matches an entry when the entry's tokens
are a prefix of it; the longest such entry wins, and at most `len(prompt) - 1` of its columns are
used (the last prompt token must run through the model to give the next-token logits). Keys and
values of the first m tokens depend on those m tokens only (causal attention, absolute
positions from 0), so they are exactly what a fresh prefill of the same prefix computes, up to
float rounding.

Matching is by whole entries, not a radix tree over every shared prefix: the case this serves is
a conversation continuing its own last turn, where the previous turn's full sequence is a prefix
of the new prompt. Lookup hashes the prompt's prefix at each length some entry has (a handful of
distinct lengths), so it costs microseconds, not a scan of every entry.

Memory is bounded by `max_tokens` cached tokens over all entries, least recently used first out.
The owner (`LocalEngine`) must `clear()` whenever the weights change: KV computed by old weights
would change the new weights' distribution, and the version recorded on each token would lie.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

import torch

from areal_nb.errors import BatchShapeError, InvalidArgumentError

LayerKV = tuple[torch.Tensor, torch.Tensor]  # keys, values: [kv_heads, n, head_dim]


@dataclass(eq=False)
class CachedPrefix:
    tokens: tuple[int, ...]
    kv: list[LayerKV]  # per layer

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class PrefixHit:
    entry: CachedPrefix
    length: int  # columns of `entry` to use (< the prompt's length)

    @property
    def kv(self) -> list[LayerKV]:
        return [(k[:, : self.length], v[:, : self.length]) for k, v in self.entry.kv]


class PrefixCache:
    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise InvalidArgumentError(f"prefix cache size must be >= 0 tokens, got {max_tokens}")
        self.max_tokens = int(max_tokens)
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()  # oldest use first
        self._lengths: Counter[int] = Counter()  # entry length -> how many entries have it
        self.tokens = 0  # cached tokens over all entries

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: list[int]) -> PrefixHit | None:
        """The longest entry that is a prefix of `prompt` (marked as recently used), or None."""
        if not self._entries or len(prompt) < 2:
            return None
        for length in sorted((n for n in self._lengths if n <= len(prompt)), reverse=True):
            entry = self._entries.get(tuple(prompt[:length]))
            if entry is not None:
                self._entries.move_to_end(entry.tokens)
                return PrefixHit(entry, min(length, len(prompt) - 1))
        return None

    def insert(self, tokens: list[int], kv: list[LayerKV], replaces: CachedPrefix | None = None) -> None:
        """Keep `kv` (the keys/values of `tokens`), evicting the least recently used as needed.

        `replaces`: the entry this sequence continued (its tokens are a prefix of `tokens`); it is
        dropped, since the new entry serves every prompt the old one did but one that is shorter.
        """
        if replaces is not None:
            self._remove(replaces.tokens)
        key = tuple(tokens)
        if len(key) > self.max_tokens or len(key) < 1:
            return
        if kv[0][0].shape[1] != len(key):
            raise BatchShapeError(
                f"prefix cache entry of {len(key)} tokens got {kv[0][0].shape[1]} KV columns"
            )
        self._remove(key)
        self._entries[key] = CachedPrefix(key, kv)
        self._lengths[len(key)] += 1
        self.tokens += len(key)
        while self.tokens > self.max_tokens:
            self._remove(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self.tokens = 0

    def _remove(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._lengths[len(key)] -= 1
        if not self._lengths[len(key)]:
            del self._lengths[len(key)]
        self.tokens -= len(key)
