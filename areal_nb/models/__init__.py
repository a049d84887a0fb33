"""Models by name: the built-in `tiny-math` and `tiny-tools` (shipped built, see `shipped.py`),
local folders, GGUF files (converted once to a cached folder, `gguf.py`) and Hugging Face ids, all
loaded through `AutoTokenizer` / `AutoModelForCausalLM`.

`tiny-math`
    Tokenizer: byte-level BPE (vocab 512 + 6 added markup tokens) trained with `tokenizers` on
    generated problem text; every digit is its own token; `<|endoftext|>` = pad (id 0),
    `<|im_start|>` (id 1), `<|im_end|>` = EOS (id 2); ChatML chat template with Qwen2.5-style
    tools and `<tool_call>` rendering. Cached as `<cache>/tiny-math/tokenizer-<hash>/` (~0.5 s).

    Model: `Qwen2ForCausalLM`, hidden 128, 4 layers, 4 heads, 1.12 M parameters (tied
    embeddings), float32. Warm start: 500 SFT steps (batch 32, every 5th batch eight two-turn
    correction examples, lr 1e-3, seed 0) on generated one-step, one-digit +/- word problems;
    replies look like `\\boxed{13}`. Greedy accuracy of the shipped build on the 200 held-out
    problems (`generate_problems(200, split="test")`): **0.465** (`shipped/tiny-math/build_info.json`).
    Build: ~2 min on one CPU core (`areal-nb build-models`).

`tiny-tools`
    The same architecture and chat template warm-started for the calculator tool task
    (`tiny_tools.py`): its own tokenizer (tools prompt ~34 tokens), 450 SFT steps on tool
    conversations; held-out greedy success of the shipped build 0.37.

    Unshipped (after an edit of a recipe or of the code that builds it) each is built on first
    use and cached as `<cache>/<name>/model-<hash>/`: `<cache>` is `$AREAL_NB_CACHE` or
    `~/.cache/areal_nb`, `<hash>` covers the recipe and that code.
"""

from .registry import TINY_MATH, TINY_TOOLS, load_model, load_tokenizer, resolve_model_path

__all__ = [
    "TINY_MATH",
    "TINY_TOOLS",
    "evaluate_accuracy",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
]


def __getattr__(name: str):
    # evaluation imports torch; keep `import areal_nb.models` cheap.
    if name == "evaluate_accuracy":
        from .evaluation import evaluate_accuracy

        return evaluate_accuracy
    raise AttributeError(f"module 'areal_nb.models' has no attribute {name!r}")
