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
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from areal_nb.data.tool_task import CALCULATOR_TOOL, answer_reward, calculator, generate_tool_problems

from .tokenizer import EOS_TOKEN, MARKUP_TOKENS, PAD_TOKEN, SPECIAL_TOKENS
from .warm_start import IGNORE, new_model, save_model, train_sft

TOOLS_TOKENIZER_RECIPE = {
    "vocab_size": 1024,
    "corpus_conversations": 3000,
    "corpus_seed": 0,
    "model_max_length": 512,
}

TOOLS_SFT_RECIPE = {
    "seed": 0,
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
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
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    template = AutoTokenizer.from_pretrained(str(template_tokenizer_dir))

    def render(messages):
        return template.apply_chat_template(messages, tools=[CALCULATOR_TOOL], tokenize=False)

    tok = Tokenizer(models.BPE(unk_token=None))
    # No word-splitting regex: merges may cross spaces, so repeated phrases become single tokens;
    # but not line ends, so "assistant\n" never merges with the reply that follows it (the engine
    # generates the reply after the prompt's tokens, and training must see the same tokens).
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", behavior="merged_with_previous"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe["vocab_size"],
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(render, recipe), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=recipe["model_max_length"],
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = template.chat_template
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out_dir))
    return hf


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
    """Greedy replies with the calculator offered, batched with left padding."""
    import torch

    ids = [
        tokenizer.apply_chat_template(c, tools=[CALCULATOR_TOOL], add_generation_prompt=True, tokenize=True)
        for c in conversations
    ]
    ids = [x["input_ids"] if isinstance(x, dict) or hasattr(x, "keys") else x for x in ids]
    width, pad = max(len(x) for x in ids), tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
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


def _direct_share(row: dict, recipe: dict, guess_phase: bool) -> float:
    if row["messages"][-1]["content"].startswith("What is"):
        return recipe["direct_share_plain"]
    return recipe["guess_phase_direct_share_word" if guess_phase else "direct_share_word"]


def build_tools_model(out_dir: Path, tokenizer_dir: Path, recipe: dict = TOOLS_SFT_RECIPE) -> dict:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as tiny-math: stable sums, no spinning against other processes
    try:
        return _build(out_dir, tokenizer_dir, recipe)
    finally:
        torch.set_num_threads(threads)


def _build(out_dir: Path, tokenizer_dir: Path, recipe: dict) -> dict:
    import torch
    from transformers import AutoTokenizer

    started = time.monotonic()
    torch.manual_seed(recipe["seed"])
    rng = random.Random(recipe["seed"])
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model = new_model(tokenizer, recipe)
    rows = generate_tool_problems(recipe["steps"] * recipe["batch_size"], seed=recipe["seed"], split="train")
    guess_from = (recipe["steps"] - recipe["guess_phase_steps"]) * recipe["batch_size"]
    examples = [
        _sft_example(
            tokenizer, conversation(r, rng, direct=rng.random() < _direct_share(r, recipe, i >= guess_from))
        )
        for i, r in enumerate(rows)
    ]
    size = recipe["batch_size"]
    batches = [examples[step * size : (step + 1) * size] for step in range(recipe["steps"])]
    losses = train_sft(model, tokenizer, batches, recipe, desc="tiny-tools warm start (SFT)")
    train_seconds = time.monotonic() - started

    held_out = generate_tool_problems(recipe["eval_problems"], split="test")
    tqdm.write(
        f"tiny-tools: measuring greedy success on {len(held_out)} held-out problems …", file=sys.stderr
    )
    success = held_out_success(model, tokenizer, held_out)

    save_model(model, tokenizer, out_dir)
    info = {
        "name": "tiny-tools",
        "recipe": recipe,
        "parameters": sum(p.numel() for p in model.parameters()),
        "held_out_success": success,
        "held_out_problems": len(held_out),
        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "train_seconds": round(train_seconds, 1),
        "build_seconds": round(time.monotonic() - started, 1),
    }
    (out_dir / "build_info.json").write_text(json.dumps(info, indent=2))
    return info
