"""`create_engine`'s precise errors for server engines (the working paths are in
test_session_engines.py, with real servers)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from areal_nb.engine import create_engine


def spec(**kw):
    return SimpleNamespace(
        **{"type": "remote", "max_batch_size": 8, "seed": 0, "addresses": [], "api_key": None, **kw}
    )


def test_remote_without_addresses_is_refused():
    with pytest.raises(ValueError, match="engine.type='remote' needs addresses"):
        create_engine(spec(), None, None, model_path="/models/m")


def test_sglang_needs_the_model_directory_the_servers_load():
    with pytest.raises(ValueError, match="engine.type='sglang' needs model_path"):
        create_engine(spec(type="sglang", launch=SimpleNamespace()), None, None)


def test_unknown_type_names_the_choices():
    with pytest.raises(ValueError, match=r"choose one of \['local', 'sglang', 'remote'\]"):
        create_engine(spec(type="vllm"), None, None)
