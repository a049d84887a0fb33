"""Throughput cost of constrained decoding on `LocalEngine` (tiny-math, CPU).

Runs the same batch of concurrent requests twice, with and without a JSON-schema grammar
(`{"answer": int}`, the integer bounded so both runs generate similar lengths), and prints
generated tokens per second of each and their ratio, plus the grammar's own per-token cost
(mask computation + advance) measured alone. Also prints the recorded kept-set size of
top-p / top-k samples (ids per token) against a packed bitmask's size, which is why kept sets
are stored as ids.

    python benchmarks/grammar_cost.py [--requests 32] [--max-new-tokens 24] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from areal_nb.api import GenerationConfig, ModelRequest, OutputConstraint
from areal_nb.api.constraints import TokenGrammar
from areal_nb.engine import LocalEngine
from areal_nb.models import load_tokenizer, resolve_model_path

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 9999}},
          "required": ["answer"], "additionalProperties": False}


async def _run(engine, tokenizer, prompts, **gconfig) -> tuple[float, list]:
    reqs = [ModelRequest(input_ids=p, gconfig=GenerationConfig(**gconfig).new_with_stop_and_pad_token_ids(tokenizer)) for p in prompts]
    start = time.perf_counter()
    responses = await asyncio.gather(*(engine.agenerate(r) for r in reqs))
    return time.perf_counter() - start, responses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tokenizer = load_tokenizer("tiny-math")
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {i} + {2 * i}?"}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False) for i in range(args.requests)]
    engine = LocalEngine(resolve_model_path("tiny-math"), tokenizer, device="cpu", seed=0)
    try:
        rates = {"plain": [], "grammar": []}
        for _ in range(args.rounds):  # alternate, so load changes hit both alike
            for name, extra in (("plain", {}), ("grammar", {"constraint": OutputConstraint("json_schema", schema=SCHEMA)})):
                # ignore_eos with a fixed length for plain decoding; the grammar run stops at its end
                seconds, responses = asyncio.run(_run(engine, tokenizer, prompts, max_new_tokens=args.max_new_tokens, temperature=1.0, **extra))
                rates[name].append(sum(r.output_len for r in responses) / seconds)
        kept = {}
        for name, extra in (("top_p=0.9", {"top_p": 0.9}), ("top_k=20", {"top_k": 20})):
            _, responses = asyncio.run(_run(engine, tokenizer, prompts, max_new_tokens=args.max_new_tokens, temperature=1.0, **extra))
            sizes = [len(k) for r in responses for k in r.sampling_masks.kept if k is not None]
            kept[name] = sum(sizes) / len(sizes)
        grammar = TokenGrammar(OutputConstraint("json_schema", schema=SCHEMA), tokenizer, engine.vocab_size)
        tokens = tokenizer.encode('{"answer": 1234}')
        start, n = time.perf_counter(), 0
        for _ in range(200):
            grammar = TokenGrammar(OutputConstraint("json_schema", schema=SCHEMA), tokenizer, engine.vocab_size)
            for t in tokens:
                grammar.allowed()
                grammar.advance(t)
                n += 1
        per_token_us = (time.perf_counter() - start) / n * 1e6
    finally:
        engine.close()
    plain, constrained = max(rates["plain"]), max(rates["grammar"])
    print(json.dumps({
        "requests": args.requests, "vocab": engine.vocab_size,
        "plain_tok_per_s": round(plain, 1), "grammar_tok_per_s": round(constrained, 1),
        "grammar_over_plain": round(constrained / plain, 3),
        "grammar_us_per_token_incl_matcher_build": round(per_token_us, 1),
        "kept_ids_per_token": {k: round(v, 1) for k, v in kept.items()},
        "bitmask_bytes_per_token": (engine.vocab_size + 7) // 8,
    }))


if __name__ == "__main__":
    main()
