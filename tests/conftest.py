"""Shared fixtures. The built-in tiny model is built once per machine and cached on disk."""

from __future__ import annotations

import os

# Two cores: keep torch from oversubscribing when tests and servers run side by side.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from areal_nb.models import load_tokenizer

    return load_tokenizer("tiny-math")


@pytest.fixture(scope="session")
def tiny_model_path():
    from areal_nb.models import resolve_model_path

    return resolve_model_path("tiny-math")
