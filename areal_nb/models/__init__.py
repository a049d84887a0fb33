"""Models by name: the built-in `tiny-math` (built from scratch and cached), local folders,
and Hugging Face ids, all loaded through `AutoTokenizer` / `AutoModelForCausalLM`."""

from .registry import TINY_MATH, load_model, load_tokenizer, resolve_model_path

__all__ = ["TINY_MATH", "evaluate_accuracy", "load_model", "load_tokenizer", "resolve_model_path"]


def __getattr__(name: str):
    # evaluation imports torch; keep `import areal_nb.models` cheap.
    if name == "evaluate_accuracy":
        from .evaluation import evaluate_accuracy

        return evaluate_accuracy
    raise AttributeError(f"module 'areal_nb.models' has no attribute {name!r}")
