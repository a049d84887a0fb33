"""Math-verify scoring of a model reply against the integer after `####`."""

from __future__ import annotations

import logging


class _DropTimeoutDisabledNotice(logging.Filter):
    """math-verify logs "Timeout is disabled ..." once per process when timeouts are off. We turn
    them off on purpose (see `score_answer`); other math-verify warnings still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledNotice())


def score_answer(reply_text: str | None, answer_value: str | int) -> float:
    """1.0 when math-verify finds the gold value in `reply_text`, else 0.0; never raises.

    Timeouts are disabled because math-verify implements them with SIGALRM, which only
    works on the main thread; rewards are computed in worker threads and event loops.
    """
    if not isinstance(reply_text, str) or not reply_text.strip():
        return 0.0
    try:
        from math_verify import parse, verify

        gold = parse(f"${answer_value}$", parsing_timeout=None)
        predicted = parse(reply_text, parsing_timeout=None)
        if not gold or not predicted:
            return 0.0
        return 1.0 if verify(gold, predicted, timeout_seconds=None) else 0.0
    except Exception:  # noqa: BLE001  junk replies may trip sympy in many ways; all of them score 0
        return 0.0
