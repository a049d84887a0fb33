"""`ServedStub`: the engine surface `create_engine_app` serves, for engines scripted in tests."""

from __future__ import annotations

from .stub_engine import StubEngine


class ServedStub(StubEngine):
    """The surface `create_engine_app` serves besides `agenerate` (which a subclass scripts): no
    tokenizer, EOS 2, a 512-token context, version 0, aborts that do nothing."""

    tokenizer = None
    eos_token_ids = [2]
    max_context = 512

    def get_version(self) -> int:
        return 0
