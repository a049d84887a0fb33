"""The LM head apart from the decoder: token log-probs and entropy, one chunk of tokens at a time.

The float32 `[tokens, vocab]` log-softmax is a training step's largest tensor (64 rows x 256
tokens of a 151,936-token vocabulary: 10 GB, and the temperature, the log-softmax and the
entropy each make another). So the decoder runs to its final hidden states (`[tokens, hidden]`,
small) and the head runs `chunk` tokens at a time: a chunk's logits, their float32 log-softmax
and entropy exist only while that chunk is computed, in the forward and again in the backward
(each chunk is a `torch.utils.checkpoint` segment: its forward keeps only its inputs, its
backward recomputes it). Per token these are the whole tensor's operations, so the values equal
it up to the rounding of the head's matmul split by rows.

`split_head` knows the families whose logits are `lm_head(hidden)`, soft-capped for Gemma 2/3
(`HEAD_MODEL_TYPES`). Any other model, and a model sharded by FSDP (whose root unit gathers the
head inside its own forward), runs its whole forward; its logits are then log-softmaxed chunk by
chunk the same way (no float32 copy of all of them, only the model's own logits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .head_forward import is_fsdp

HEAD_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")


@dataclass
class SplitHead:
    """A causal LM as its decoder (ids → final hidden states) and its head (hidden → logits)."""

    decoder: torch.nn.Module
    project: Callable[[Tensor], Tensor]


def split_head(model: torch.nn.Module) -> SplitHead | None:
    """`model` split before its LM head, or None where its logits are computed otherwise."""
    config = getattr(model, "config", None)
    decoder, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if getattr(config, "model_type", None) not in HEAD_MODEL_TYPES or decoder is None or is_fsdp(model):
        return None
    if not isinstance(head, torch.nn.Linear):
        return None
    softcap = getattr(config, "final_logit_softcapping", None)

    def project(hidden: Tensor) -> Tensor:
        logits = head(hidden)
        if softcap:  # as the model's own forward does (Gemma 2/3)
            logits = torch.tanh(logits / softcap) * softcap
        return logits

    return SplitHead(decoder, project)


def chunked_token_logprobs(
    x: Tensor,
    targets: Tensor,
    temperature: float,
    chunk: int,
    project: Callable[[Tensor], Tensor] | None = None,
    with_entropy: bool = True,
    allowed: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs `[n]` (float32) of `targets [n]` and the entropy `[n]` of each predictive
    distribution (no gradient: reported, not trained on), `chunk` tokens at a time.

    `x` is hidden states `[n, D]` that `project` maps to logits, or (without `project`) the
    logits `[n, V]` themselves. `allowed` = (`index [k]` into the n tokens, bool `[k, V]`): at
    those tokens the distribution is restricted to the allowed set and renormalised (the
    sampler's distribution under a grammar / top-k / top-p mask, `sampling_replay.py`)."""
    logprobs, entropy = [], []
    # (no token: one empty chunk, so that the result still hangs off the graph for a backward)
    for lo in range(0, len(x), chunk) or [0]:
        part = None
        if allowed is not None:
            inside = (allowed[0] >= lo) & (allowed[0] < lo + chunk)
            part = (allowed[0][inside] - lo, allowed[1][inside]) if bool(inside.any()) else None
        args = (x[lo : lo + chunk], targets[lo : lo + chunk], temperature, project, with_entropy, part)
        if (
            torch.is_grad_enabled() and len(x) > chunk
        ):  # keep only the chunk's inputs; the backward recomputes it
            lp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(*args)
        logprobs.append(lp)
        entropy.append(ent)
    return torch.cat(logprobs), torch.cat(entropy) if with_entropy else None


def _chunk_logprobs(
    x: Tensor,
    targets: Tensor,
    temperature: float,
    project: Callable[[Tensor], Tensor] | None,
    with_entropy: bool,
    allowed: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    # Each [n, V] tensor here is as large as the chunk's logits, so no more of them live at once
    # than the arithmetic needs: no division at temperature 1 (x / 1 is x, bit for bit, and so
    # is its gradient), the logits and the scaled copy dropped once the log-softmax (which keeps
    # only its output for the backward) has read them, the entropy's terms computed in place.
    logits = project(x) if project is not None else x
    scaled = logits.float() if temperature == 1.0 else logits.float() / temperature
    del logits
    if allowed is not None:
        scaled = scaled + _masking_bias(allowed, scaled.shape)
    log_probs = F.log_softmax(scaled, dim=-1)
    del scaled
    picked = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    if not with_entropy:
        return picked, None
    with torch.no_grad():
        detached = log_probs.detach()
        terms = detached.exp().mul_(detached)
        if allowed is not None:  # 0 · (−inf) is 0 in the entropy, not NaN
            terms = terms.nan_to_num_(nan=0.0)
        return picked, -terms.sum(-1)


def _masking_bias(allowed: tuple[Tensor, Tensor], shape: torch.Size) -> Tensor:
    """float32 `shape` = [n, V]: −inf outside the allowed set at the indexed rows, 0 elsewhere
    (an allowed set narrower than V, the engine's vocabulary, allows none of the extra ids)."""
    index, sets = allowed
    bias = torch.zeros(shape, dtype=torch.float32, device=index.device)
    full = torch.zeros(len(index), shape[-1], dtype=torch.bool, device=index.device)
    full[:, : sets.shape[-1]] = sets.to(index.device)
    bias[index] = torch.zeros_like(full, dtype=torch.float32).masked_fill(~full, float("-inf"))
    return bias
