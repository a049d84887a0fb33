"""The Session's task data: an endless, seeded training stream and the held-out split.

Both come from the same `data.source`: generated GSM8K-format problems (the test split is a
fixed held-out stream), or a GSM8K source whose test split `evaluate()` scores
(`areal_nb.data.load_gsm8k_split`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

from areal_nb.config import ConfigError, DataConfig
from areal_nb.data import generate_problems, load_gsm8k_split


def held_out_problems(cfg: DataConfig) -> list[dict]:
    """The first `cfg.eval_size` problems of the source's test split."""
    if cfg.source == "generated":
        return generate_problems(cfg.eval_size, seed=0, split="test", config=cfg.task)
    problems = load_gsm8k_split(cfg.source, "test")
    if not problems:
        raise ConfigError(f"data.source {cfg.source!r} holds no test problems to evaluate on")
    return problems[: cfg.eval_size]


class DataStream:
    """An endless, seeded stream of training prompts whose position can be saved."""

    def __init__(self, cfg: DataConfig, pos: int = 0) -> None:
        self.pos = 0
        self._chunk = self._chunk_maker(cfg)
        self._buffer: list[dict] = []
        self._chunk_index = 0
        for _ in range(pos):
            next(self)

    @staticmethod
    def _chunk_maker(cfg: DataConfig) -> Callable[[int], list[dict]]:
        """Chunk k of the stream: 512 fresh generated problems, or the k-th shuffle of the file."""
        if cfg.source == "generated":
            return lambda k: generate_problems(512, seed=cfg.seed * 100_003 + k, split="train", config=cfg.task)
        items = load_gsm8k_split(cfg.source, "train")
        if not items:
            raise ConfigError(f"data.source {cfg.source!r} holds no training problems")

        def chunk(k: int) -> list[dict]:
            order = list(items)
            random.Random(cfg.seed * 100_003 + k).shuffle(order)
            return order

        return chunk

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        if not self._buffer:
            self._buffer = list(reversed(self._chunk(self._chunk_index)))
            self._chunk_index += 1
        self.pos += 1
        return self._buffer.pop()
