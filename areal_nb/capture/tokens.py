"""Text ⇄ token ids as the proxy's doors see them: a plain prompt encoded the way vLLM encodes a
text completion's (`add_special_tokens`, so a tokenizer with a BOS token gets it), token ids
checked against the vocabulary, ids decoded back. The proxy's `/tokenize`, `/detokenize` and
`/v1/completions` share these, so what `/tokenize` answers is what a completion sends the engine.
"""

from __future__ import annotations

import asyncio
from typing import Any

from areal_nb.errors import ContextLengthExceeded

from .messages import CompletionRequestError
from .request_limits import max_chars_per_token

# Text up to this many characters is encoded on the event loop, longer text in a worker thread
# (the same bound, and the same reason, as chat rendering's INLINE_RENDER_CHARS).
_INLINE_ENCODE_CHARS = 2 * 1024


def _vocabulary_size(tokenizer: Any) -> int:
    """How many ids the tokenizer knows: its vocabulary plus added tokens."""
    return len(tokenizer)


def check_token_ids(ids: Any, tokenizer: Any, where: str) -> list[int]:
    """`ids` as a list of ints, each an id of the tokenizer's vocabulary; a clear 400 otherwise."""
    if not isinstance(ids, list):
        raise CompletionRequestError(f"{where} must be a list of token ids, got {type(ids).__name__}")
    size = _vocabulary_size(tokenizer)
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int):
            raise CompletionRequestError(f"{where}[{i}] must be an integer token id, got {token!r:.40}")
        if not 0 <= token < size:
            raise CompletionRequestError(
                f"{where}[{i}] = {token} is not a token id of this model (0 … {size - 1})"
            )
    return list(ids)


def check_text_fits(text: str, tokenizer: Any, context: int | None, where: str) -> None:
    """Refuse, before encoding it, text that cannot fit `context` tokens (`ContextLengthExceeded`
    with a lower bound on its tokens): no token stands for more than `max_chars_per_token`
    characters (as `check_prompt_size` does for chat)."""
    if context is None:
        return
    per_token = max_chars_per_token(tokenizer)
    limit = (context - 1) * per_token
    if len(text) > limit:
        raise ContextLengthExceeded(
            -(-len(text) // per_token),  # no token covers more than `per_token` characters
            context,
            at_least=True,
            detail=(
                f"{where} holds {len(text)} characters, more than the {limit} characters that "
                f"could fit the model context of {context} tokens"
            ),
        )


async def encode_text(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    """`text`'s ids, in a worker thread when it is long."""

    def encode() -> list[int]:
        return [int(t) for t in tokenizer.encode(text, add_special_tokens=add_special_tokens)]

    return await asyncio.to_thread(encode) if len(text) > _INLINE_ENCODE_CHARS else encode()


def decode_ids(tokenizer: Any, ids: list[int]) -> str:
    """The text of `ids`, special tokens included (what the model saw or wrote)."""
    return tokenizer.decode(ids, skip_special_tokens=False)


def token_strings(tokenizer: Any, ids: list[int]) -> list[str]:
    """The vocabulary entry of each id (vLLM's `token_strs`)."""
    return [str(s) for s in tokenizer.convert_ids_to_tokens(ids)]
