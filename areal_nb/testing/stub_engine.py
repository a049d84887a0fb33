"""`StubEngine`: what an engine a test scripts can do, stated once for the test engines."""

from __future__ import annotations

from areal_nb.api import InferenceEngine


class StubEngine(InferenceEngine):
    """The capabilities of an engine whose replies a test scripts: it generates, nothing more (no
    adapters, no sampling masks, no model object, no counters, weights nobody pushes to), and
    its aborts do nothing (a scripted reply has nothing in flight worth stopping)."""

    # capabilities (`InferenceEngine`)
    max_context: int | None = None  # no context limit unless the engine or a test sets one
    serves_lora_adapters = False
    weights_may_differ = False
    records_sampling_masks = False
    serves_models_in_process = False
    shares_weights = False
    stats = None

    def abort(self, rid: str) -> None:
        pass

    def abort_all(self) -> None:
        pass

    def drop_caches(self) -> None:  # no caches
        pass
