"""`PromptMemo`: the prompt ids of recently rendered conversations, per tokenizer.

A GRPO group sends the same conversation `group_size` times (8 episodes, one prompt), and
rendering plus tokenizing it was two thirds of the CPU a chat completion cost the proxy (0.17 of
0.25 ms per call on an instant engine, tiny-math's template). The render is a pure function of
what the template reads — the messages, tools, template variables and the template itself — so
the ids are kept for recent inputs and a repeat costs a type walk and one `orjson.dumps` of the input.

What is never memoised, so a hit can never differ from a fresh render:
- templates that read the clock (`strftime_now`, e.g. Llama 3's "Today Date");
- inputs that are not plain JSON values (exact dict/list/str/int/float/bool/None, str keys,
  finite floats, no lone surrogates): the key is their JSON text, and an Enum, UUID or str
  subclass would serialise like a plain string yet may render differently;
- inputs whose JSON exceeds `MAX_KEY_BYTES` (bounds the memo's memory; a few-shot prompt fits);
- renders that raised (the error is raised again on every call).
The memo follows the tokenizer's `chat_template`: assigning a new one empties it. It does not
watch the vocabulary: after adding tokens to a tokenizer in use, call `prompt_memo(tokenizer).clear()`.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

_MAX_ENTRIES = 512  # a step's distinct prompts (16-128) with room for the eval twin's
MAX_KEY_BYTES = 8 * 1024
_SCALARS = (str, int, bool, type(None))


class PromptMemo:
    """Recent {input: prompt ids} of one tokenizer; thread-safe (renders run on several loops and
    in worker threads)."""

    def __init__(self, max_entries: int = _MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()
        self._template: Any = None
        self._usable = False
        self.hits = 0
        self.misses = 0

    def ids(self, template: Any, key_parts: tuple[Any, ...], render: Callable[[], list[int]]) -> list[int]:
        """`render()`'s ids, from the memo when `key_parts` were rendered with `template` before."""
        key = self._key(template, key_parts)
        if key is not None:
            with self._lock:
                found = self._entries.get(key)
                if found is not None:
                    self._entries.move_to_end(key)
                    self.hits += 1
                    return list(found)
        ids = render()
        if key is not None:
            with self._lock:
                self.misses += 1
                if self._template is template or self._template == template:  # not replaced meanwhile
                    self._entries[key] = tuple(ids)
                    if len(self._entries) > self.max_entries:
                        self._entries.popitem(last=False)
        return ids

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def _key(self, template: Any, key_parts: tuple[Any, ...]) -> bytes | None:
        with self._lock:
            if template is not self._template and template != self._template:
                self._entries.clear()
                self._template = template
                self._usable = _memoisable(template)
            if not self._usable:
                return None
        if not _plain_json(key_parts):
            return None
        try:
            key = orjson.dumps(key_parts)
        except TypeError:  # orjson.JSONEncodeError: a lone surrogate or an int beyond 64 bits
            return None
        return key if len(key) <= MAX_KEY_BYTES else None


def _memoisable(template: Any) -> bool:
    """A template (or dict of named templates) that renders the same input the same way every time."""
    sources = template.values() if isinstance(template, dict) else (template,)
    return all(isinstance(s, str) and "strftime_now" not in s for s in sources)


def _plain_json(value: Any) -> bool:
    """Whether `value` holds only exact JSON types (no subclasses), str keys and finite floats:
    the values whose JSON text tells them apart (NaN would print as null)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            for key, inner in item.items():
                if type(key) is not str:
                    return False
                stack.append(inner)
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind not in _SCALARS:
            return False
    return True


_memos: weakref.WeakKeyDictionary[Any, PromptMemo] = weakref.WeakKeyDictionary()
_memos_lock = threading.Lock()


def prompt_memo(tokenizer: Any) -> PromptMemo | None:
    """The memo of `tokenizer` (created on first use); None for objects that cannot be weakly referenced."""
    with _memos_lock:
        try:
            memo = _memos.get(tokenizer)
            if memo is None:
                memo = _memos[tokenizer] = PromptMemo()
        except TypeError:  # not weakly referenceable or not hashable
            return None
        return memo
