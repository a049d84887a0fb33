"""Build `tiny-tools`: the tiny Qwen2 warm-started to call the calculator in its chat template's format.

Same architecture and chat template as `tiny-math` (Qwen2.5-style `<tools>` system prompt and
`<tool_call>` blocks), two differences:

- Tokenizer: byte-level BPE *without* the word-splitting regex, trained on rendered tool
  conversations, so merges may span spaces and the fixed tools preamble and the calculator's
  JSON schema compress to a few long tokens (the prompt is ~50 tokens instead of ~380 with the
  `tiny-math` tokenizer). Digits stay single tokens.
- Warm start: SFT on generated calculator conversations — the question, a `<tool_call>` with the
  product's expression, the tool's result, "The answer is N." — mixed with conversations where
  the assistant answers at once with a plausible wrong product: none of the "What is a times b?"
  questions, 60 % of the word problems, 85 % of them in the last 100 steps. The model then calls
  the tool on the plain questions and mostly guesses on the word problems: held-out success
  well below 1, with a clear path for RL — call the tool on word problems too — to raise it.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from areal_nb.data.tool_task import CALCULATOR_TOOL, answer_reward, calculator, generate_tool_problems

from .evaluation import greedy_replies
from .tokenizer import EOS_TOKEN, MARKUP_TOKENS, SPECIAL_TOKENS, train_tokenizer
from .warm_start import ARCHITECTURE, IGNORE, warm_start

TOOLS_TOKENIZER_RECIPE = {
    "vocab_size": 1024,
    "corpus_conversations": 3000,
    "corpus_seed": 0,
    "model_max_length": 512,
}

TOOLS_SFT_RECIPE = {
    "seed": 0,
    **ARCHITECTURE,
    "steps": 450,
    "batch_size": 32,
    "lr": 1e-3,
    "warmup_steps": 10,
    # The share of conversations that answer at once with a wrong guess instead of calling the
    # tool: never for "What is a times b?"; for the word problems (eggs, buses) 60 % while the
    # digit copying is learned, then 85 % in the last `guess_phase_steps` steps, so the model
    # leaves off calling the tool on most word problems (measured: with 60 % to the end it calls
    # it greedily on all of them, 0.95 held-out success, nothing left for RL).
    "direct_share_plain": 0.0,
    "direct_share_word": 0.6,
    "guess_phase_steps": 100,
    "guess_phase_direct_share_word": 0.85,
    "eval_problems": 100,
}
_MARKUP_RE = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + MARKUP_TOKENS))


def tool_call_text(expression: str) -> str:
    """The assistant's tool call, exactly as the chat template renders a parsed call back."""
    args = json.dumps({"expression": expression})
    return f'<tool_call>\n{{"name": "calculator", "arguments": {args}}}\n</tool_call>'


def wrong_guess(row: dict, rng: random.Random) -> str:
    """A plausible but wrong product (what answering without the tool looks like)."""
    a, b = (int(x) for x in row["expression"].split("*"))
    guess = a * b + rng.choice([-1, 1]) * rng.randint(1, 60)
    return str(guess if guess != a * b else guess + 1)


def conversation(row: dict, rng: random.Random, direct: bool) -> list[dict]:
    """A full reference conversation for `row`: tool call, result, answer; or a direct guess."""
    messages = list(row["messages"])
    if direct:
        return messages + [{"role": "assistant", "content": f"The answer is {wrong_guess(row, rng)}."}]
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "calculator", "arguments": json.dumps({"expression": row["expression"]})},
    }
    return messages + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": calculator(row["expression"])},
        {"role": "assistant", "content": f"The answer is {row['answer']}."},
    ]


def _corpus(render, recipe: dict) -> list[str]:
    """Rendered conversations, cut at the special and markup tokens (those are added, not learned)."""
    rng = random.Random(recipe["corpus_seed"])
    rows = generate_tool_problems(recipe["corpus_conversations"], seed=recipe["corpus_seed"], split="corpus")
    texts = []
    for row in rows:
        text = render(conversation(row, rng, direct=rng.random() < 0.3))
        texts += [piece for piece in _MARKUP_RE.split(text) if piece]
    return texts


def build_tools_tokenizer(out_dir: Path, template_tokenizer_dir: Path, recipe: dict = TOOLS_TOKENIZER_RECIPE):
    """Train the tokenizer (chat template of `template_tokenizer_dir`), save it to `out_dir`; returns it."""
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    template = AutoTokenizer.from_pretrained(str(template_tokenizer_dir))

    def render(messages):
        return template.apply_chat_template(messages, tools=[CALCULATOR_TOOL], tokenize=False)

    # No word-splitting regex: merges may cross spaces, so repeated phrases become single tokens;
    # but not line ends, so "assistant\n" never merges with the reply that follows it (the engine
    # generates the reply after the prompt's tokens, and training must see the same tokens).
    splits = [
        pre_tokenizers.Split("\n", behavior="merged_with_previous"),
        pre_tokenizers.Digits(individual_digits=True),
    ]
    return train_tokenizer(out_dir, _corpus(render, recipe), splits, False, template.chat_template, recipe)


def _sft_example(tokenizer, messages: list[dict]):
    """(input_ids, labels) with the loss on every assistant reply and its `<|im_end|>`.

    One render and one encode per conversation (the build makes ~15k of them): tokens whose
    characters lie inside a reply (after "<|im_start|>assistant\\n", up to and including its
    "<|im_end|>") are trained. The tokenizer never merges across a line end, so these are the
    tokens the engine would generate after the prompt's "assistant\\n".
    """
    text = tokenizer.apply_chat_template(messages, tools=[CALCULATOR_TOOL], tokenize=False)
    spans, head = [], "<|im_start|>assistant\n"
    start = text.find(head)
    while start >= 0:
        end = text.index(EOS_TOKEN, start) + len(EOS_TOKEN)
        spans.append((start + len(head), end))
        start = text.find(head, end)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    labels = [
        tok if any(a <= lo and hi <= b for a, b in spans) else IGNORE
        for tok, (lo, hi) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
    ]
    return list(enc["input_ids"]), labels


def held_out_success(model, tokenizer, rows: list[dict], max_new_tokens: int = 32) -> float:
    """Greedy success of the call-the-tool-then-answer loop (2 turns), without the proxy."""

    def prompts(convs):
        return _greedy_replies(model, tokenizer, convs, max_new_tokens)

    convs = [list(r["messages"]) for r in rows]
    first = prompts(convs)
    answers, second_convs, second_idx = list(first), [], []
    for i, reply in enumerate(first):
        # the proxy's parser in brief (models must not import the openai layer): the first block
        block = re.search(r"<tool_call>\s*(.*?)\s*</tool_call>", reply, re.DOTALL)
        try:
            call = json.loads(block.group(1)) if block else None
            arguments = json.dumps(call["arguments"])
            result = calculator(**call["arguments"])
        except (json.JSONDecodeError, TypeError, KeyError):
            continue  # not a well-formed call: the reply is the answer
        second_convs.append(
            convs[i]
            + [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_0",
                            "type": "function",
                            "function": {"name": call.get("name"), "arguments": arguments},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_0", "content": result},
            ]
        )
        second_idx.append(i)
    if second_convs:
        for i, reply in zip(second_idx, prompts(second_convs), strict=True):
            answers[i] = reply
    return sum(answer_reward(r, a) for r, a in zip(rows, answers, strict=True)) / len(rows)


def _greedy_replies(model, tokenizer, conversations: list[list[dict]], max_new_tokens: int) -> list[str]:
    """Greedy replies with the calculator offered, in one batch."""
    ids = [
        tokenizer.apply_chat_template(c, tools=[CALCULATOR_TOOL], add_generation_prompt=True, tokenize=True)
        for c in conversations
    ]
    ids = [x["input_ids"] if isinstance(x, dict) or hasattr(x, "keys") else x for x in ids]
    return greedy_replies(model, tokenizer, ids, max_new_tokens)


def _direct_share(row: dict, recipe: dict, guess_phase: bool) -> float:
    if row["messages"][-1]["content"].startswith("What is"):
        return recipe["direct_share_plain"]
    return recipe["guess_phase_direct_share_word" if guess_phase else "direct_share_word"]


def build_tools_model(out_dir: Path, tokenizer_dir: Path, recipe: dict = TOOLS_SFT_RECIPE) -> dict:
    """Warm-start the model, measure held-out success, save model + tokenizer + build_info.json."""
    held_out = generate_tool_problems(recipe["eval_problems"], split="test")
    return warm_start(
        "tiny-tools", out_dir, tokenizer_dir, recipe, sft_batches, (held_out, held_out_success, "success")
    )


def sft_batches(tokenizer, recipe: dict = TOOLS_SFT_RECIPE) -> list[list[tuple[list[int], list[int]]]]:
    """The SFT batches in training order, deterministic by `recipe["seed"]`: tool conversations,
    or direct guesses at the recipe's shares (`_direct_share`)."""
    rng = random.Random(recipe["seed"])
    rows = generate_tool_problems(recipe["steps"] * recipe["batch_size"], seed=recipe["seed"], split="train")
    guess_from = (recipe["steps"] - recipe["guess_phase_steps"]) * recipe["batch_size"]
    examples = [
        _sft_example(
            tokenizer, conversation(r, rng, direct=rng.random() < _direct_share(r, recipe, i >= guess_from))
        )
        for i, r in enumerate(rows)
    ]
    size = recipe["batch_size"]
    return [examples[step * size : (step + 1) * size] for step in range(recipe["steps"])]
