"""Example agents written against the plain OpenAI SDK, run through the proxy."""

from .math_agent import MultiTurnMathAgent
from .solver_checker import SolverCheckerAgent

__all__ = ["MultiTurnMathAgent", "SolverCheckerAgent"]
