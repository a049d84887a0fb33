"""Fixtures for the engine tests: the real tiny-math model, and an independent reference copy."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# pytest runs with --import-mode=importlib (no sys.path changes): make engine_test_helpers importable.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def reference_model(tiny_model_path):
    """tiny-math loaded on its own (not through the engine), for plain unpadded forward passes."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()


@pytest.fixture
def engine(tiny_model_path):
    from areal_nb.engine import LocalEngine

    eng = LocalEngine(tiny_model_path, seed=0)
    yield eng
    eng.close()
