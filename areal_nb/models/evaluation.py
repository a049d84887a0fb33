"""Greedy held-out accuracy of a causal LM on math problems, scored with math-verify."""

from __future__ import annotations

from areal_nb.data import score_answer
from areal_nb.errors import InvalidArgumentError


def evaluate_accuracy(
    model, tokenizer, problems: list[dict], max_new_tokens: int = 16, batch_size: int = 64
) -> float:
    """Fraction of `problems` whose greedy reply math-verify scores correct.

    Prompts are each problem's `messages` through the chat template with a generation prompt,
    batched with left padding (so every row's last token is the prompt's last token).
    """
    if not problems:
        raise InvalidArgumentError("evaluate_accuracy needs at least one problem")
    replies = generate_replies(
        model,
        tokenizer,
        [p["messages"] for p in problems],
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
    )
    scores = [score_answer(r, p["answer_value"]) for r, p in zip(replies, problems, strict=True)]
    return sum(scores) / len(scores)


def generate_replies(
    model, tokenizer, conversations: list[list[dict]], max_new_tokens: int = 16, batch_size: int = 64
) -> list[str]:
    """Greedy assistant replies (decoded without special tokens) for each conversation."""
    replies: list[str] = []
    for start in range(0, len(conversations), batch_size):
        chunk = conversations[start : start + batch_size]
        prompts = [
            tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in chunk
        ]
        ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        replies += greedy_replies(model, tokenizer, ids, max_new_tokens)
    return replies


def greedy_replies(model, tokenizer, prompts: list[list[int]], max_new_tokens: int) -> list[str]:
    """Greedy continuations of token-id `prompts`, generated as one batch with left padding (so
    every row's last token is its prompt's last), decoded without special tokens."""
    import torch

    device = next(model.parameters()).device
    width, pad = max(len(x) for x in prompts), tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in prompts], device=device)
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts], device=device)
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=pad,
        )
    return [tokenizer.decode(row, skip_special_tokens=True) for row in out[:, width:].tolist()]
