"""A generated task whose answer needs a tool: multiply two 2-digit numbers with a calculator.

A small model cannot multiply 37 × 48 in its head, but it can learn to call
`calculator({"expression": "37*48"})` (the OpenAI `tools` format) and copy the result into its
answer. Rows: `{"messages", "answer", "expression"}`; `answer_reward(row, reply)` is 1.0 when the
reply's last number is the product. `train_rows` / `test_rows` are the splits `configs/tool_use.yaml`
names (`data.source: areal_nb.data.tool_task:train_rows`): no pair of factors is in both.
"""

from __future__ import annotations

import ast
import operator
import random
import re

from areal_nb.errors import InvalidArgumentError

CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_TEMPLATES = (
    "What is {a} times {b}?",
    "A box holds {a} rows of {b} eggs. How many eggs are in the box?",
    "Each of {a} buses carries {b} people. How many people are there?",
)


def calculator(expression: str) -> str:
    """The value of an integer `+ - *` expression, as text; an "error: ..." text otherwise
    (a tool reports errors to the model, it does not raise)."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise InvalidArgumentError("only integers and + - * are supported")

    try:
        if len(expression) > 64:
            raise InvalidArgumentError("expression too long")
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, TypeError) as e:
        return f"error: {e}"


def generate_tool_problems(n: int, seed: int = 0, split: str = "train") -> list[dict]:
    """`n` multiplication problems; train and test draw from disjoint seeds."""
    rng = random.Random(f"{split}-{seed}")
    rows = []
    for _ in range(n):
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        question = rng.choice(_TEMPLATES).format(a=a, b=b)
        rows.append(
            {
                "messages": [{"role": "user", "content": question}],
                "answer": str(a * b),
                "expression": f"{a}*{b}",
            }
        )
    return rows


def answer_reward(row: dict, reply: str) -> float:
    """1.0 when the last number in `reply` is the row's answer."""
    numbers = re.findall(r"-?\d+", reply or "")
    return 1.0 if numbers and numbers[-1] == str(row["answer"]) else 0.0


TEST_SIZE = 200
TRAIN_SIZE = 4096


def test_rows() -> list[dict]:
    """The held-out split: `TEST_SIZE` problems."""
    return generate_tool_problems(TEST_SIZE, split="test")


def train_rows() -> list[dict]:
    """`TRAIN_SIZE` training problems, none with the factors (in either order) of a test problem."""
    held_out = {frozenset(r["expression"].split("*")) for r in test_rows()}
    rows = generate_tool_problems(TRAIN_SIZE + 2 * len(held_out), split="train")
    return [r for r in rows if frozenset(r["expression"].split("*")) not in held_out][:TRAIN_SIZE]
