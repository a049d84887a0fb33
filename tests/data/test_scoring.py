"""score_answer: math-verify against the integer after ####, robust to junk and threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from areal_nb.data import score_answer


@pytest.mark.parametrize(
    "reply, gold, expected",
    [
        ("3+4=7. \\boxed{7}", "7", 1.0),
        ("The answer is \\boxed{12}", "12", 1.0),
        ("\\boxed{12}", 12, 1.0),
        ("12", "12", 1.0),
        ("$12.0$", "12", 1.0),
        ("3+4=7. \\boxed{8}", "7", 0.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("I don't know", "7", 0.0),
        ("", "7", 0.0),
        ("   ", "7", 0.0),
        (None, "7", 0.0),
        ("\\boxed{", "7", 0.0),
        ("}{}{\\frac{\\frac{", "7", 0.0),
        ("\\boxed{7}", "not a number", 0.0),
    ],
)
def test_score_answer_cases(reply, gold, expected):
    assert score_answer(reply, gold) == expected


def test_score_answer_works_off_the_main_thread():
    # math-verify's default timeouts use SIGALRM and fail in worker threads.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(score_answer, ["\\boxed{5}", "\\boxed{6}"], ["5", "5"]))
    assert results == [1.0, 0.0]
