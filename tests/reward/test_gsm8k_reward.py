import pytest

from areal_nb.reward import gsm8k_reward_fn, math_reward


@pytest.mark.parametrize(
    ("result", "answer", "expected"),
    [
        ("Tom has 3 + 4 = 7 apples. The answer is 7", "#### 7", 1.0),
        ("7", "7", 1.0),
        ("The answer is 8", "#### 7", 0.0),
        ("So the total is \\boxed{42}.", "#### 42", 1.0),
        ("So the total is \\boxed{41}.", "42", 0.0),
        ("x = \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("half of it: 1/2", "#### 0.5", 1.0),
        ("The temperature fell to -3", "#### -3", 1.0),
        ("The temperature fell to 3", "#### -3", 0.0),
        ("She paid 1,000 dollars", "Work: 500*2 = 1000\n#### 1,000", 1.0),
        ("no idea", "#### 7", 0.0),
        ("", "7", 0.0),
        ("\\boxed{", "7", 0.0),
        ("7", "not a number at all", 0.0),
    ],
)
def test_math_reward(result, answer, expected):
    assert math_reward(result, answer) == expected


def test_gsm8k_reward_fn_keyword_form():
    assert (
        gsm8k_reward_fn(
            prompt="q",
            completions="The answer is \\boxed{12}",
            prompt_ids=[1],
            completion_ids=[2],
            answer="#### 12",
            extra="ignored",
        )
        == 1.0
    )
    assert gsm8k_reward_fn(completions="The answer is 11", answer="#### 12") == 0.0
    assert gsm8k_reward_fn(completions=None, answer="#### 12") == 0.0
    assert gsm8k_reward_fn(completions="12", answer=None) == 0.0
    # non-string inputs are converted, not rejected
    assert gsm8k_reward_fn(completions=12, answer=12) == 1.0


def test_math_reward_scores_a_repeated_pair_once_and_the_same():
    """A group's samples often repeat a reply: the (reply, gold) pair is parsed once per process,
    and the repeated score is the first one, for right and wrong answers and other golds alike."""
    from areal_nb.reward.gsm8k import _score

    _score.cache_clear()
    replies = ["The answer is 7", "The answer is 8", "The answer is 7", "\\boxed{7}"] * 8
    scores = [math_reward(r, "#### 7") for r in replies]
    assert scores == [1.0, 0.0, 1.0, 1.0] * 8
    assert _score.cache_info().misses == 3  # three distinct replies against one gold
    assert math_reward("The answer is 7", "#### 8") == 0.0  # the gold is part of the key
    assert math_reward("The answer is 7", "Work: 3+4\n#### 7") == 1.0  # same final answer, same key
    assert _score.cache_info().misses == 4
