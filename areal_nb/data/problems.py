"""GSM8K-format arithmetic word problems generated from a seed.

Every problem is a short story over small numbers ("Mia has 3 apples. She gets 4 more. ...");
its answer is a worked solution, one equation per line, then `#### <int>` as in GSM8K.
The "test" split is a fixed held-out set: a question belongs to it when a hash of its text
falls into the test bucket, so train and test never share a question whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from areal_nb.errors import ConfigError, DatasetError, InvalidArgumentError

OPERATIONS = ("+", "-", "*")
SPLITS = ("train", "test")
# Seed of the held-out stream: the test split is the same list for every caller seed.
_TEST_STREAM_SEED = 20_251_130

CORRECTION_PROMPT = (
    "Your answer is either wrong or not parsable to the reward function. "
    "You may misunderstand the original question. "
    "Please carefully read the original question, check the previous errors, "
    "and try to answer it again."
)


@dataclass(frozen=True)
class TaskConfig:
    """`data.task`: knobs of the generated task (`data.source: generated`).

    Operands are drawn from [min_operand, max_operand]; each problem applies between
    min_steps and max_steps operations chosen from `operations` to a starting amount.
    Subtractions never go below zero. `test_fraction` of all possible questions (by hash)
    form the held-out split.
    """

    min_operand: int = 0
    """The smallest operand."""
    max_operand: int = 9
    """The largest operand."""
    operations: tuple[str, ...] = ("+", "-")
    """The operations problems draw from: any of "+", "-", "*"."""
    min_steps: int = 1
    """The fewest operations in one problem."""
    max_steps: int = 1
    """The most operations in one problem."""
    test_fraction: float = 0.1
    """The share of all possible questions (by hash) held out for evaluation."""

    def __post_init__(self) -> None:
        if isinstance(self.operations, str | list):
            object.__setattr__(self, "operations", tuple(self.operations))
        if not self.operations:
            raise ConfigError("TaskConfig.operations must name at least one of '+', '-', '*'")
        unknown = [op for op in self.operations if op not in OPERATIONS]
        if unknown:
            raise ConfigError(f"unknown operation(s) {unknown}; choose from {list(OPERATIONS)}")
        if self.min_operand < 0 or self.max_operand < self.min_operand:
            raise ConfigError(
                f"operand range [{self.min_operand}, {self.max_operand}] must be non-negative and non-empty"
            )
        if self.min_steps < 1 or self.max_steps < self.min_steps:
            raise ConfigError(
                f"steps range [{self.min_steps}, {self.max_steps}] must start at 1 or more and be non-empty"
            )
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"test_fraction must be in (0, 1), got {self.test_fraction}")


_NAMES = [
    ("Mia", "she", "her"),
    ("Tom", "he", "his"),
    ("Ava", "she", "her"),
    ("Leo", "he", "his"),
    ("Zoe", "she", "her"),
    ("Sam", "he", "his"),
    ("Lily", "she", "her"),
    ("Ben", "he", "his"),
    ("Emma", "she", "her"),
    ("Noah", "he", "his"),
    ("Ella", "she", "her"),
    ("Jack", "he", "his"),
    ("Nora", "she", "her"),
    ("Omar", "he", "his"),
    ("Ruby", "she", "her"),
    ("Liam", "he", "his"),
]
_OBJECTS = [
    "apples",
    "pencils",
    "stickers",
    "marbles",
    "books",
    "cookies",
    "coins",
    "cards",
    "shells",
    "balloons",
    "stamps",
    "toy cars",
    "oranges",
    "candies",
    "flowers",
    "eggs",
]
_PLACES = ["box", "basket", "bag", "jar", "drawer", "bowl"]

# Two story shapes: a person who owns things, and a container someone fills or empties.
_OWNER_START = ["{name} has {a} {obj}.", "{name} starts with {a} {obj}.", "{name} owns {a} {obj}."]
_OWNER_STEP = {
    "+": [
        "{Pron} gets {b} more.",
        "{Pron} buys {b} more.",
        "{Pron} finds {b} more.",
        "A friend gives {name} {b} more.",
    ],
    "-": [
        "{Pron} gives away {b}.",
        "{Pron} loses {b}.",
        "{Pron} sells {b}.",
        "{Pron} gives {b} to a friend.",
    ],
    "*": ["Then the number of {obj} {pron} has becomes {b} times as large."],
}
_OWNER_QUESTION = ["How many {obj} does {name} have now?", "How many {obj} does {name} have in the end?"]
_PLACE_START = ["There are {a} {obj} in the {place}.", "A {place} holds {a} {obj}."]
_PLACE_STEP = {
    "+": ["{name} puts {b} more in.", "{name} adds {b} {obj}."],
    "-": ["{name} takes {b} out.", "{name} removes {b} {obj}."],
    "*": ["Then the number of {obj} in the {place} becomes {b} times as large."],
}
_PLACE_QUESTION = ["How many {obj} are in the {place} now?", "How many {obj} are in the {place} in the end?"]


def _apply(total: int, op: str, b: int) -> int:
    return total + b if op == "+" else total - b if op == "-" else total * b


def _draw_steps(rng: random.Random, cfg: TaskConfig) -> tuple[int, list[tuple[str, int]]] | None:
    """Starting amount and (op, operand) steps, or None when the draw hit a dead end."""
    total = rng.randint(cfg.min_operand, cfg.max_operand)
    start = total
    steps: list[tuple[str, int]] = []
    for _ in range(rng.randint(cfg.min_steps, cfg.max_steps)):
        ops = list(cfg.operations)
        rng.shuffle(ops)
        for op in ops:
            high = min(cfg.max_operand, total) if op == "-" else cfg.max_operand
            if high >= cfg.min_operand:
                b = rng.randint(cfg.min_operand, high)
                break
        else:
            return None  # only subtractions allowed and nothing left to subtract
        steps.append((op, b))
        total = _apply(total, op, b)
    return start, steps


def _story(rng: random.Random, start: int, steps: list[tuple[str, int]]) -> str:
    name, pron, _ = rng.choice(_NAMES)
    fields = {
        "name": name,
        "pron": pron,
        "Pron": pron.capitalize(),
        "obj": rng.choice(_OBJECTS),
        "place": rng.choice(_PLACES),
    }
    if rng.random() < 0.5:
        start_t, step_t, question_t = _OWNER_START, _OWNER_STEP, _OWNER_QUESTION
    else:
        start_t, step_t, question_t = _PLACE_START, _PLACE_STEP, _PLACE_QUESTION
    sentences = [rng.choice(start_t).format(a=start, **fields)]
    sentences += [rng.choice(step_t[op]).format(b=b, **fields) for op, b in steps]
    sentences.append(rng.choice(question_t).format(**fields))
    return " ".join(sentences)


def _solution_lines(start: int, steps: list[tuple[str, int]]) -> list[str]:
    lines, total = [], start
    for op, b in steps:
        new = _apply(total, op, b)
        lines.append(f"{total}{op}{b}={new}")
        total = new
    return lines


def split_of(question: str, test_fraction: float = 0.1) -> str:
    """ "test" or "train": the fixed split a question text belongs to."""
    bucket = int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "big")
    return "test" if bucket / 2**64 < test_fraction else "train"


def make_problem(question: str, answer: str) -> dict:
    """The dict shape shared by generated and loaded problems."""
    if "####" not in answer:
        raise DatasetError(f"answer has no '####' final-answer marker: {answer!r}")
    value = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not value:
        raise DatasetError(f"answer has nothing after '####': {answer!r}")
    return {
        "question": question,
        "answer": answer,
        "answer_value": value,
        "messages": [{"role": "user", "content": question}],
    }


def generate_problems(
    n: int, seed: int = 0, split: str = "train", config: TaskConfig | None = None
) -> list[dict]:
    """`n` GSM8K-format problems of `split`.

    "train": a seeded stream (repeats are possible, as in any sampled dataset).
    "test": the first `n` distinct held-out questions of a fixed stream; `seed` is ignored so
    every caller evaluates on the same problems, and a shorter list is a prefix of a longer one.
    """
    if split not in SPLITS:
        raise InvalidArgumentError(f"split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise InvalidArgumentError(f"n must be >= 0, got {n}")
    cfg = config or TaskConfig()
    rng = random.Random(_TEST_STREAM_SEED if split == "test" else seed)
    problems: list[dict] = []
    seen: set[str] = set()
    # A config whose question space is exhausted (or only hits dead ends) fails loudly
    # instead of looping: give up after this many draws in a row that yield nothing.
    patience, misses = 20_000, 0
    while len(problems) < n:
        if misses >= patience:
            raise ConfigError(
                f"could only generate {len(problems)} of {n} {split!r} problems with {cfg}; "
                "widen the operand range, the operations or the steps"
            )
        misses += 1
        drawn = _draw_steps(rng, cfg)
        if drawn is None:
            continue
        start, steps = drawn
        question = _story(rng, start, steps)
        if split_of(question, cfg.test_fraction) != split:
            continue
        if split == "test":
            if question in seen:
                continue
            seen.add(question)
        answer = "\n".join(_solution_lines(start, steps)) + f"\n#### {_apply_all(start, steps)}"
        problems.append(make_problem(question, answer))
        misses = 0
    return problems


def _apply_all(start: int, steps: list[tuple[str, int]]) -> int:
    total = start
    for op, b in steps:
        total = _apply(total, op, b)
    return total


def reference_reply(problem: dict) -> str:
    """The short assistant reply the built-in model is taught: the boxed answer alone.

    e.g. "\\boxed{7}" — a handful of tokens. Longer replies (the equation first) gave a 1 M
    parameter policy room to produce junk around a right number, which a math-verify reward
    then reinforces; the answer-only form learns visibly under RL within minutes on a CPU.
    """
    return reply_for(problem, problem["answer_value"])


def reply_for(problem: dict, value: str | int) -> str:
    """A reply in the reference format whose answer is `value`.

    With a wrong `value` this is a plausible wrong answer (used for two-turn correction data).
    """
    return f"\\boxed{{{value}}}"
