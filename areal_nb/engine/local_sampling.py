"""Sampling for `LocalEngine`'s worker: one token per row from a step's logits, recorded on the row
with its log-probability and the engine version that sampled it, and the row's stop check.

A row whose sampling fails fails alone (its `error` is set, the worker takes it out of the batch);
rows sampled under a mask (a grammar, top-k/top-p, banned ids) also record each token's allowed set
and log-probability under the masked distribution (`SamplingMasks`).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .local_state import EngineStats, RateLimitedLog, Row
from .sampling import VocabScratch, sample_masked, sample_next_tokens


class RowSampling:
    """`LocalEngine`'s sampling steps (a base of `LocalEngine`; runs on its worker thread only)."""

    tokenizer: Any
    stats: EngineStats
    _generator: torch.Generator
    _scratch: VocabScratch
    _version: int
    _errors: RateLimitedLog

    def _sample_and_record(self, logits: torch.Tensor, rows: list[Row]) -> None:
        banned = None
        if any(r.plan.min_new_tokens for r in rows):
            banned = [
                sorted(r.plan.stop_token_ids) if len(r.output) < r.plan.min_new_tokens else [] for r in rows
            ]
        if any(r.masked for r in rows):
            self._sample_masked_and_record(logits, rows, banned)
            return
        picked: list[tuple[int, float] | None]
        try:
            tokens, logprobs = sample_next_tokens(
                logits, [r.plan.sampling for r in rows], self._generator, banned, self._scratch
            )
            picked = list(zip(tokens.tolist(), logprobs.tolist(), strict=True))
        except Exception:
            # A row whose sampling fails fails alone: sample row by row, the others go on.
            picked = [
                self._sample_one(logits[i : i + 1], row, None if banned is None else [banned[i]])
                for i, row in enumerate(rows)
            ]
        version = self._version
        now = time.perf_counter()
        for row, choice in zip(rows, picked, strict=True):
            if choice is None:
                continue  # failed: _retire takes it out of the batch
            token, logprob = choice
            row.output.append(token)
            row.logprobs.append(logprob)
            row.versions.append(version)
            if row.first_token_at is None:
                row.first_token_at = now
            row.stop_reason = self._stop_reason(row, token)
        self.stats.tokens += len(rows)

    def _sample_masked_and_record(
        self, logits: torch.Tensor, rows: list[Row], banned: list[list[int]] | None
    ) -> None:
        """Sampling where some row is masked: grammar masks first, then what each row's
        distribution was is recorded with its token (`SamplingMasks`)."""
        try:
            allowed = [None if r.grammar is None else r.grammar.allowed() for r in rows]
            choice = sample_masked(logits, [r.plan.sampling for r in rows], self._generator, banned, allowed)
        except Exception as exc:  # a grammar fault fails these rows, not the engine
            self._errors.exception("LocalEngine could not sample under a mask")
            for row in rows:
                row.error = RuntimeError(f"LocalEngine masked sampling failed: {exc!r}")
            return
        version = self._version
        now = time.perf_counter()
        for i, (row, token, logprob, sampled) in enumerate(
            zip(
                rows,
                choice.tokens.tolist(),
                choice.logprobs.tolist(),
                choice.sampled_logprobs.tolist(),
                strict=True,
            )
        ):
            row.output.append(token)
            row.logprobs.append(logprob)
            row.versions.append(version)
            if row.masked:
                row.kept.append(choice.kept[i])
                row.sampled_logprobs.append(sampled)
            if row.first_token_at is None:
                row.first_token_at = now
            if row.grammar is not None and not row.grammar.advance(token):
                row.error = RuntimeError(
                    f"LocalEngine sampled token {token}, which its grammar did not allow"
                )
                continue
            row.stop_reason = self._stop_reason(row, token)
        self.stats.tokens += len(rows)

    def _sample_one(
        self, logits: torch.Tensor, row: Row, banned: list[list[int]] | None
    ) -> tuple[int, float] | None:
        try:
            tokens, logprobs = sample_next_tokens(logits, [row.plan.sampling], self._generator, banned)
            return int(tokens[0]), float(logprobs[0])
        except Exception as exc:
            self._errors.exception("LocalEngine could not sample request %s", row.plan.rid)
            row.error = RuntimeError(f"LocalEngine sampling failed for this request: {exc!r}")
            return None

    def _stop_reason(self, row: Row, token: int) -> str | None:
        plan = row.plan
        if token in plan.stop_token_ids:  # stop ids cannot be sampled before min_new_tokens
            return "stop"
        if plan.stop_strings:
            text = self.tokenizer.decode(row.output, skip_special_tokens=False)
            for stop in plan.stop_strings:
                # only occurrences that end in the newly decoded text: earlier ones were checked
                if stop in text[max(0, row.checked_text_len - len(stop) + 1) :]:
                    return "stop"
            row.checked_text_len = len(text)
        if len(row.output) >= plan.max_new_tokens:
            return "length"
        return None
