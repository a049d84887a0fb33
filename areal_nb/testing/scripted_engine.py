"""`ScriptedEngine`: an instant engine that replies with a scripted token sequence.

Used where a test needs one specific model output (a tool call, a fixed answer) and by the
proxy-overhead benchmark as a zero-cost engine. Every scripted test has a twin on the real
tiny model; this engine never stands in for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from areal_nb.api import ModelRequest, ModelResponse

from .stub_engine import StubEngine

Script = str | Sequence[int] | Callable[[ModelRequest], "str | Sequence[int]"]


class ScriptedEngine(StubEngine):
    """Replies to every request with `script` (text, token ids, or a function of the request).

    Text is encoded with the tokenizer and the EOS token appended; token ids are used as
    given. Log-probs are a fixed `logprob` per token; versions are the engine's version.
    `max_new_tokens` truncates the reply (stop_reason "length"). Capabilities: `StubEngine`'s.
    """

    def __init__(self, tokenizer, script: Script, logprob: float = -0.5) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.logprob = logprob
        self._version = 0
        self.requests: list[ModelRequest] = []

    def _tokens_for(self, req: ModelRequest) -> list[int]:
        out = self.script(req) if callable(self.script) else self.script
        if isinstance(out, str):
            return self.tokenizer.encode(out, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return list(out)

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        start = time.perf_counter()
        self.requests.append(req)
        tokens = self._tokens_for(req)
        limit = min(req.gconfig.max_new_tokens, req.gconfig.max_tokens - len(req.input_ids))
        stop_reason = "stop"
        if len(tokens) > limit:
            tokens, stop_reason = tokens[: max(limit, 0)], "length"
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=tokens,
            output_logprobs=[self.logprob] * len(tokens),
            output_versions=[self._version] * len(tokens),
            stop_reason=stop_reason,
            latency=time.perf_counter() - start,
            tokenizer=self.tokenizer,
        )

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = version

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def update_weights(self, weights, version: int | None = None) -> None:
        if version is not None:
            self._version = version

    def close(self) -> None:
        pass

    def rng_state(self) -> None:  # the script draws nothing at random
        return None

    def set_rng_state(self, state: object) -> None:
        pass
