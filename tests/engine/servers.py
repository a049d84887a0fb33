"""Engine servers for the tests: `areal-nb engine-server` as a real subprocess on loopback, or a
real SGLang server someone else started (the device check) described by environment variables:

  AREAL_NB_SGLANG_URL          base URL of a running sglang server (enables the "sglang" entries)
  AREAL_NB_SGLANG_MODEL        the model directory it serves (for references and new weights)
  AREAL_NB_SGLANG_WEIGHTS_DIR  a directory the server can read (weights are written there)
  AREAL_NB_SGLANG_API_KEY      its --api-key, if any
  AREAL_NB_SGLANG_LOGPROB_TOL  log-prob tolerance against a float32 reference (default 0.1: bf16)
  AREAL_NB_SGLANG_LONG_TOKENS  max_new_tokens of a generation that runs for a while (default 16000)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

from areal_nb.engine.launcher import ServerProcess, engine_server_command, free_port
from areal_nb.engine.weight_sync import write_weights

API_KEY = "contract-test-key"


@dataclass
class ServerUnderTest:
    name: str
    url: str
    api_key: str | None
    weights_dir: Path
    model_path: str
    logprob_tol: float
    long_tokens: int  # max_new_tokens that keeps a generation busy long enough to interrupt it
    process: ServerProcess | None = None
    versions_written: list[int] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, timeout: float = 300.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def version(self) -> str:
        with self.client() as c:
            return c.get("/model_info").json()["weight_version"]

    def admitted_prompt_tokens(self) -> int | None:
        """Prompt tokens the engine-server has admitted so far (None for SGLang, which has no such
        counter): lets a test wait until its requests are decoding instead of sleeping."""
        if self.process is None:
            return None
        with self.client() as c:
            return c.get("/server_info").json()["internal_states"][0]["prompt_tokens"]

    def wait_until_admitted(self, before: int | None, tokens: int, timeout: float = 60.0) -> None:
        if before is None:  # real SGLang: no counter; give the requests a moment to start decoding
            time.sleep(0.3)
            return
        deadline = time.monotonic() + timeout
        while self.admitted_prompt_tokens() - before < tokens:
            assert time.monotonic() < deadline, f"{tokens} prompt tokens not admitted within {timeout} s"
            time.sleep(0.01)


def start_engine_server(
    tmp_dir: Path,
    *,
    api_key: str | None = API_KEY,
    name: str = "server",
    weights_dir: Path | None = None,
    extra_args: list[str] = (),
) -> ServerProcess:
    port = free_port()
    weights = weights_dir or tmp_dir / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    proc = ServerProcess(
        engine_server_command(
            "tiny-math", port=port, api_key=api_key, weights_dir=weights, extra_args=extra_args
        ),
        f"http://127.0.0.1:{port}",
        log_path=tmp_dir / f"{name}.log",
    )
    proc.start()
    proc.wait_ready(timeout=300)
    return proc


def engine_server_under_test(tmp_dir: Path) -> ServerUnderTest:
    from areal_nb.models import resolve_model_path

    proc = start_engine_server(tmp_dir)
    return ServerUnderTest(
        name="engine-server",
        url=proc.url,
        api_key=API_KEY,
        weights_dir=tmp_dir / "weights",
        model_path=str(resolve_model_path("tiny-math")),
        logprob_tol=1e-4,
        long_tokens=480,
        process=proc,
    )


def sglang_under_test() -> ServerUnderTest | None:
    url = os.environ.get("AREAL_NB_SGLANG_URL")
    if not url:
        return None
    return ServerUnderTest(
        name="sglang",
        url=url.rstrip("/"),
        api_key=os.environ.get("AREAL_NB_SGLANG_API_KEY") or None,
        weights_dir=Path(os.environ["AREAL_NB_SGLANG_WEIGHTS_DIR"]),
        model_path=os.environ["AREAL_NB_SGLANG_MODEL"],
        logprob_tol=float(os.environ.get("AREAL_NB_SGLANG_LOGPROB_TOL", "0.1")),
        long_tokens=int(os.environ.get("AREAL_NB_SGLANG_LONG_TOKENS", "16000")),
    )


def load_reference(path: str | Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def perturbed_copy(model, seed: int, scale: float = 0.05):
    """An independent model with every weight moved by N(0, scale²) noise (tied weights stay tied)."""
    other = type(model)(model.config).eval()
    other.load_state_dict(model.state_dict())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return other


def write_new_version(server: ServerUnderTest, model, version: int) -> Path:
    server.versions_written.append(version)
    return write_weights(server.weights_dir, version, model)


def teacher_forced(model, prompt: list[int], output: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(output)[:, None]).squeeze(1)


def error_text(response: httpx.Response) -> str:
    """sglang answers 400 as {"error": "..."} (contract violations) or {"error": {"message": ...}}."""
    error = response.json().get("error")
    return error.get("message", "") if isinstance(error, dict) else str(error)
