"""Says when training steps stop carrying a learning signal: once, and again only if it comes back.

Every step's history row has `zero_signal_groups`, `truncated_share` and `reply_len_mean`
(`rollout.learning_signal`). When most groups of a step had equal rewards, the step taught little
or nothing (all of them: loss and grad norm 0), and the user should hear it with what to try,
but once per stretch of such steps, not once per step for the rest of the run.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

from areal_nb.errors import NoLearningSignalWarning
from areal_nb.rollout.learning_signal import ZERO_SIGNAL, no_signal_advice


class SignalWatch:
    """`observe(row)` after each step: a `NoLearningSignalWarning` at the first step of each
    stretch of steps in which most groups had no signal."""

    def __init__(self) -> None:
        self.silent = False  # inside such a stretch (it was said)

    def observe(self, row: Mapping[str, Any], stacklevel: int = 4) -> None:
        share = row.get(ZERO_SIGNAL)
        if share is None or math.isnan(share):  # not measured (no accepted episode, a rank ≠ 0)
            return
        advice = no_signal_advice(row)
        if advice is not None and not self.silent:
            # (the step in the text: Python shows a repeated warning from one place only once)
            warnings.warn(NoLearningSignalWarning(f"step {row.get('step')}: {advice}"), stacklevel=stacklevel)
        self.silent = advice is not None
