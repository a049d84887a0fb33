"""Models by name: the built-in `tiny-math` (built from scratch and cached), local folders,
and Hugging Face ids, all loaded through `AutoTokenizer` / `AutoModelForCausalLM`.

`tiny-math`
    Tokenizer: byte-level BPE (vocab 512 + 6 added markup tokens) trained with `tokenizers` on
    generated problem text; every digit is its own token; `<|endoftext|>` = pad (id 0),
    `<|im_start|>` (id 1), `<|im_end|>` = EOS (id 2); ChatML chat template with Qwen2.5-style
    tools and `<tool_call>` rendering. Cached as `<cache>/tiny-math/tokenizer-<hash>/` (~0.5 s).

    Model: `Qwen2ForCausalLM`, hidden 128, 4 layers, 4 heads, 1.12 M parameters (tied
    embeddings), float32. Warm start: 500 SFT steps (batch 32, every 5th batch eight two-turn
    correction examples, lr 1e-3, seed 0) on generated one-step, one-digit +/- word problems;
    replies look like `\\boxed{13}`. Measured greedy accuracy on the 200 held-out problems
    (`generate_problems(200, split="test")`): **0.545**; within two turns (the correction prompt
    after a wrong answer) 0.605, i.e. the second turn fixes ~13 % of the wrong first answers.
    Build: ~110 s on one core of the shared 2-core machine. Cached as
    `<cache>/tiny-math/model-<hash>/` with `build_info.json`.

`tiny-tools`
    The same architecture and chat template warm-started for the calculator tool task
    (`tiny_tools.py`): its own tokenizer (tools prompt ~34 tokens), 450 SFT steps on tool
    conversations; held-out greedy success 0.32. Cached as `<cache>/tiny-tools/model-<hash>/`.

    `<cache>` is `$AREAL_NB_CACHE` or `~/.cache/areal_nb`; `<hash>` covers the recipe and the
    code that builds it, so changing either rebuilds.
"""

from .registry import TINY_MATH, TINY_TOOLS, load_model, load_tokenizer, resolve_model_path

__all__ = ["TINY_MATH", "TINY_TOOLS", "evaluate_accuracy", "load_model", "load_tokenizer", "resolve_model_path"]


def __getattr__(name: str):
    # evaluation imports torch; keep `import areal_nb.models` cheap.
    if name == "evaluate_accuracy":
        from .evaluation import evaluate_accuracy

        return evaluate_accuracy
    raise AttributeError(f"module 'areal_nb.models' has no attribute {name!r}")
