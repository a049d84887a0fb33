"""`ServedStub`: the engine surface `create_engine_app` serves, for engines scripted in tests."""

from __future__ import annotations

from areal_nb.api import InferenceEngine


class ServedStub(InferenceEngine):
    """The surface `create_engine_app` serves besides `agenerate` (which a subclass scripts): no
    tokenizer, EOS 2, a 512-token context, version 0, aborts that do nothing."""

    tokenizer = None
    eos_token_ids = [2]
    # capabilities (`InferenceEngine`)
    max_context = 512
    serves_lora_adapters = False
    weights_may_differ = False
    records_sampling_masks = False
    serves_models_in_process = False
    shares_weights = False
    stats = None

    def get_version(self) -> int:
        return 0

    def abort(self, rid: str) -> None:
        pass

    def abort_all(self) -> None:
        pass
