"""Example agents written against the plain OpenAI SDK, run through the proxy."""

from .math_agent import MultiTurnMathAgent

__all__ = ["MultiTurnMathAgent"]
