"""The `tiny-math` tokenizer: byte-level BPE trained on generated text, digits as single tokens."""

from __future__ import annotations

import json
import random
from pathlib import Path

from areal_nb.data import CORRECTION_PROMPT, generate_problems, reference_reply
from areal_nb.data.problems import TaskConfig
from areal_nb.data.tool_task import CALCULATOR_TOOL

from .chat_template import CHAT_TEMPLATE, TOOLS_POSTAMBLE, TOOLS_PREAMBLE

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = PAD_TOKEN  # Qwen2 convention: no BOS is prepended; the config names endoftext
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, "<|im_start|>", EOS_TOKEN]  # ids 0, 1, 2
# Not special, as in Qwen2.5: decoding with skip_special_tokens=True keeps them.
MARKUP_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
]

TOKENIZER_RECIPE = {
    "vocab_size": 512,
    "corpus_problems": 4000,
    "corpus_seed": 0,
    "model_max_length": 512,
}

_TOOL_EXAMPLES = [
    CALCULATOR_TOOL,
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]


def _corpus(recipe: dict) -> list[str]:
    """Deterministic training text: problems, replies, chat markup, the correction prompt, tools."""
    rng = random.Random(recipe["corpus_seed"])
    wide = TaskConfig(operations=("+", "-", "*"), max_steps=3)
    texts = []
    for p in generate_problems(recipe["corpus_problems"], seed=recipe["corpus_seed"], config=wide):
        texts.append(p["question"])
        texts.append(p["answer"])
        texts.append(f"user\n{p['question']}\nassistant\n{reference_reply(p)}\n")
    texts += [CORRECTION_PROMPT] * 300  # frequent enough for its words to merge
    texts += [TOOLS_PREAMBLE + TOOLS_POSTAMBLE] * 20
    for _ in range(200):
        tool = rng.choice(_TOOL_EXAMPLES)
        args = {"expression": f"{rng.randint(0, 99)}+{rng.randint(0, 99)}"}
        texts.append(json.dumps(tool))
        texts.append(json.dumps({"name": tool["function"]["name"], "arguments": args}))
        texts.append("system\nYou are a helpful assistant.\ntool\n" + json.dumps({"result": 3}))
    return texts


def build_tokenizer(out_dir: Path, recipe: dict = TOKENIZER_RECIPE):
    """Train the tokenizer, attach the chat template, save it to `out_dir`; returns it."""
    from tokenizers import pre_tokenizers

    # Digits are split off individually before byte-level BPE, so no merge can span digits.
    splits = [pre_tokenizers.Digits(individual_digits=True)]
    return train_tokenizer(out_dir, _corpus(recipe), splits, True, CHAT_TEMPLATE, recipe)


def train_tokenizer(
    out_dir: Path, texts: list[str], splits: list, use_regex: bool, chat_template: str, recipe: dict
):
    """Byte-level BPE of `recipe["vocab_size"]` trained on `texts`, the built-in models' way: the
    special tokens first (ids 0, 1, 2), the pre-tokenizers `splits` before the byte-level one (with
    or without its word-splitting regex), the markup tokens added after training; saved to
    `out_dir` with `chat_template` and returned as a `PreTrainedTokenizerFast`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe["vocab_size"],
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=recipe["model_max_length"],
        padding_side="right",  # as Qwen2.5; batched generation must switch to "left"
        clean_up_tokenization_spaces=False,  # decode(encode(x)) == x exactly
    )
    hf.chat_template = chat_template
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out_dir))
    return hf
