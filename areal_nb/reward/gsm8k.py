"""GSM8K / math answer checking with `math_verify` (AReaL's `gsm8k_reward_fn`).

Both functions are module-level so `AsyncRewardWrapper` can pickle them into its worker
processes. They never raise: anything unparsable or any error scores 0.0.

Timeouts: `math_verify`'s own timeouts use SIGALRM, which only works on a main thread, so they
are disabled here (`parsing_timeout=None`, `timeout_seconds=None`). A pathological expression
is stopped by `AsyncRewardWrapper`'s per-call timeout, which replaces the worker process.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

logger = logging.getLogger(__name__)


class _DropTimeoutDisabledNotice(logging.Filter):
    """math-verify logs "Timeout is disabled ..." once per process when timeouts are off. We turn
    them off on purpose (see above); other math-verify warnings still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledNotice())

# How many digits after rounding must agree for floats (AReaL's `precision=6`).
_FLOAT_ROUNDING = 6
_EXTRACTION = (ExprExtractionConfig(try_extract_without_anchor=True), LatexExtractionConfig())


def _gold_text(answer: Any) -> str:
    """The final answer of a gold string: text after the last '####' (GSM8K format), else all."""
    text = str(answer)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    return text.strip()


def _parse(text: str) -> list:
    return parse(text, extraction_config=_EXTRACTION, parsing_timeout=None)


def math_reward(result: Any, answer: Any) -> float:
    """1.0 if the answer extracted from `result` equals the gold `answer`, else 0.0.

    `answer` may be a bare value ("7", "-3", "0.5") or a GSM8K solution ending in "#### 7".
    `result` is model text; the answer may be boxed (\\boxed{7}), a fraction, or the last
    number in plain text.
    """
    return _score(str(result), _gold_text(answer))


# The score is a pure function of the two strings, and a GRPO group scores its 8 samples against
# one gold answer, often with identical replies: parsing goes through sympy (~0.5 ms a call,
# measured), so each distinct (reply, gold) pair is scored once per process.
@functools.lru_cache(maxsize=16384)
def _score(result: str, gold_text: str) -> float:
    try:
        gold = list(_parse_gold(gold_text))
        if not gold:
            logger.warning("gold answer %r is not parsable; scoring 0.0", gold_text)
            return 0.0
        pred = _parse(result)
        if not pred:
            return 0.0
        return 1.0 if verify(gold, pred, float_rounding=_FLOAT_ROUNDING, timeout_seconds=None) else 0.0
    except Exception as exc:  # a reward must never take the rollout down
        logger.warning("math_verify failed on %r vs %r: %r; scoring 0.0", result, gold_text, exc)
        return 0.0


# A group's distinct replies are all scored against one gold answer: its parse (a third of a
# score's CPU, measured ~0.23 ms) is done once per gold text; a tuple, so no caller can change it.
@functools.lru_cache(maxsize=4096)
def _parse_gold(gold_text: str) -> tuple:
    return tuple(_parse(gold_text))


def gsm8k_reward_fn(
    prompt: Any = None,
    completions: Any = None,
    prompt_ids: Any = None,
    completion_ids: Any = None,
    answer: Any = None,
    **kwargs: Any,
) -> float:
    """AReaL's reward-function signature: scores `completions` (text) against `answer`."""
    if completions is None or answer is None:
        return 0.0
    return math_reward(completions, answer)
