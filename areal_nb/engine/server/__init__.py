"""`create_engine_app(engine, settings)`: an in-process engine behind SGLang's native HTTP API subset.

What `areal-nb engine-server` serves (CPU machines, CI, the cluster export's CPU path), and what the
`SGLangEngine` client is tested against. The semantics follow `docs/reference/sglang-api.md`:
- `/generate`: `input_ids` (one prompt or a batch), the closed `sampling_params` key set (an unknown
  key is a 400), `return_logprob`; the reply has `text`, `output_ids` and `meta_info` with
  `finish_reason` objects, `output_token_logprobs` triples, `weight_version` and per-token
  `weight_versions` spans, `prompt_tokens`, `completion_tokens`.
- `/pause_generation` (`abort`: in-flight requests return partial output with an abort reason;
  `retract` / `in_place`: they freeze and go on after `/continue_generation`, under the new weights
  if an update came in between); new `/generate` calls wait while paused.
- `/update_weights_from_disk`: when not paused it waits for in-flight generations and holds new ones
  back (sglang's writer lock); when paused it applies at once. Only directories under
  `settings.weights_dir` are read (resolved, so `..` and symlinks cannot leave it).
- LoRA (`settings.lora`, `--enable-lora`; `lora_serving.py`): `/load_lora_adapter`,
  `/unload_lora_adapter` and `lora_path` on `/generate`, with SGLang's replies and messages; one
  adapter (or the base) is in the engine at a time, and a request for another waits at the gate
  in `gate.ServingState.admit` until the running batch drains (first come, first served; a request
  waiting there is not reached by `/abort_request` until it enters). Adapter folders are read
  only under `settings.weights_dir`.
- `--api-key`: every route but `/health*` needs `Authorization: Bearer KEY` (401 otherwise).
Bad input is a 400 and disturbs nothing; our own faults are 500s with a logged traceback.
Its modules: `app.py` puts the app together, `routes.py` serves the routes, `gate.py` holds the
pause, update and adapter gate, `translate.py` turns SGLang's bodies into the engine's requests and
its responses back (the `/generate` wire itself is `engine/sglang_wire.py`, shared with the client),
and `asgi.py` serves `/generate` below FastAPI and checks the key.

The engine is any object with LocalEngine's surface (`agenerate`, `abort`, `abort_all`, `pause`,
`resume`, `update_weights(path, version)`, `set_version`, `get_version`, `tokenizer`,
`max_context`, `eos_token_ids`); this package never loads a model itself.
"""

from .app import create_engine_app
from .settings import EngineServerSettings

__all__ = ["EngineServerSettings", "create_engine_app"]
