"""Teacher-forced log-probabilities of the tokens in a batch, in the engine's layout.

Position t holds log p(token_t | tokens_<t) under softmax(logits / temperature); position 0
(no context) holds 0. This is where the capture layer stores each generated token's engine
log-prob, so recomputed and recorded log-probs compare position by position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from areal_nb.errors import InvalidArgumentError

from .lm_head import chunked_token_logprobs, split_head


def logits_to_token_logprobs(
    logits: Tensor, input_ids: Tensor, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """`logits [B, L, V]` (logit at t predicts token t+1) → token log-probs `[B, L]` (and entropy)."""
    if temperature <= 0:
        raise InvalidArgumentError(f"temperature must be > 0, got {temperature}")
    log_probs = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    picked = log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    zeros = picked.new_zeros(picked.shape[0], 1)
    token_logprobs = torch.cat([zeros, picked], dim=1)
    entropy = None
    if with_entropy:
        with torch.no_grad():  # reported, not trained on
            lp = log_probs.detach()
            entropy = torch.cat([zeros.detach(), -(lp.exp() * lp).sum(-1)], dim=1)
    return token_logprobs, entropy


def _forward_logits(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    if attention_mask is not None:
        attention_mask = attention_mask.long()
    return model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def compute_token_logprobs(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None, temperature: float = 1.0
) -> Tensor:
    """Log-probs `[B, L]` of `input_ids` under `model` (right-padded rows; padding positions are junk)."""
    logits = _forward_logits(model, input_ids, attention_mask)
    return logits_to_token_logprobs(logits, input_ids, temperature)[0]


def compute_token_logprobs_and_entropy(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    temperature: float = 1.0,
    chunk: int = 0,
    allowed: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Like `compute_token_logprobs`, plus the entropy of the predictive distribution at each token.

    `chunk` > 0: the LM head and log-softmax run that many tokens at a time (`lm_head.py`).
    `allowed` = (`positions [k, 2]` (row, token position), bool `[k, V]`): those tokens' log-probs
    are renormalised over their allowed set (`sampling_replay.py`)."""
    if allowed is not None:
        chunk = chunk or input_ids.numel()  # (the masked path is the chunked one)
    if chunk:
        return _chunked(model, input_ids, attention_mask, temperature, chunk, allowed)
    logits = _forward_logits(model, input_ids, attention_mask)
    logprobs, entropy = logits_to_token_logprobs(logits, input_ids, temperature, with_entropy=True)
    assert entropy is not None
    return logprobs, entropy


def _chunked(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    temperature: float,
    chunk: int,
    allowed: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    if temperature <= 0:
        raise InvalidArgumentError(f"temperature must be > 0, got {temperature}")
    head = split_head(model)
    if attention_mask is not None:
        attention_mask = attention_mask.long()
    out = (head.decoder if head else model)(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False
    )
    x = out.last_hidden_state if head else out.logits  # [B, L, D | V]
    rows, length = input_ids.shape
    flat_allowed = None
    if allowed is not None:  # token t of row b is predicted at flat position b·(L−1) + t − 1
        positions, sets = allowed
        flat_allowed = (positions[:, 0] * (length - 1) + positions[:, 1] - 1, sets)
    logprobs, entropy = chunked_token_logprobs(
        x[:, :-1].reshape(rows * (length - 1), x.shape[-1]),
        input_ids[:, 1:].reshape(-1),
        temperature,
        chunk,
        project=head.project if head else None,
        allowed=flat_allowed,
    )
    assert entropy is not None
    zeros = logprobs.new_zeros(rows, 1)
    return (
        torch.cat([zeros, logprobs.view(rows, length - 1)], dim=1),
        torch.cat([zeros, entropy.view(rows, length - 1)], dim=1),
    )
