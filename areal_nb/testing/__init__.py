"""Test helpers for code built on areal_nb — not part of the training path.

`ScriptedEngine` is an `InferenceEngine` that answers instantly with a reply you script (text,
token ids, or a function of the request), with fixed log-probs. Use it in your own tests when a
test needs one exact model output — a tool call, a malformed answer, a reply that arrives after
a delay — or a zero-cost engine to measure the proxy's own overhead. areal_nb's test suite and
`benchmarks/proxy_overhead.py` use it the same way; wherever a real model can run, our tests
also run the tiny built-in model (`LocalEngine("tiny-math")`).

`sample_batch(engine, prompts, gconfig, reward, n_samples)` samples from any engine and lays the
responses out as a GRPO training batch (the capture layer's tensors, built without the proxy),
for tests of the trainer against a real engine.

`ServedStub` is the rest of the surface the engine-server app serves (no tokenizer, EOS 2,
version 0, aborts that do nothing), for engines whose `agenerate` a test or benchmark scripts.

Nothing in the product package imports this module (an import-linter contract checks it).
"""

from .engine_batches import responses_to_batch, sample_batch
from .scripted_engine import Script, ScriptedEngine
from .served_stub import ServedStub

__all__ = ["Script", "ScriptedEngine", "ServedStub", "responses_to_batch", "sample_batch"]
