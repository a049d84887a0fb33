"""`EngineServerSettings`: what `areal-nb engine-server` is started with."""

from __future__ import annotations

from dataclasses import dataclass

from ..admission import DEFAULT_ADMISSION_MAX_WAIT
from ..defaults import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES
from ..lora_serving import LoraSettings


@dataclass
class EngineServerSettings:
    model_path: str = ""
    served_model_name: str = ""
    api_key: str | None = None
    weights_dir: str | None = None  # the only tree /update_weights_from_disk may read
    # a burst reaching an idle engine starts as one batch (admission.py); 0 sends each at once.
    # An app made in code (tests, benchmarks) starts each request at once; `areal-nb engine-server`
    # passes DEFAULT_ADMISSION_GAP.
    admission_gap: float = 0.0
    admission_max_wait: float = DEFAULT_ADMISSION_MAX_WAIT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger bodies → 413 (defaults.py says why)
    body_timeout: float = DEFAULT_BODY_TIMEOUT  # a body not complete this long after its headers → 408
    # LoRA adapters (`--enable-lora` and its flags; lora_serving.py); None: LoRA is not enabled
    lora: LoraSettings | None = None
