"""`model.path` as a GGUF file: what is refused, and with which error, before any weights load.

The conversion of a real GGUF model (SmolLM2) and everything that runs on it is in
tests/models/test_smollm2.py (slow).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from areal_nb.errors import ArealError, MissingPackageError, ModelFileError
from areal_nb.models import resolve_model_path
from areal_nb.models.gguf import gguf_architecture, supported_architectures


def _write_gguf(path, arch: str) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_missing_gguf_file_is_named(tmp_path):
    missing = tmp_path / "nowhere.gguf"
    with pytest.raises(ModelFileError, match=r"nowhere\.gguf.*no such file"):
        resolve_model_path(str(missing))


def test_a_file_that_is_not_gguf_is_refused_by_its_first_bytes(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf file")
    with pytest.raises(ModelFileError, match=r"is not a GGUF file \(it starts with b'PK\\x03\\x04'"):
        resolve_model_path(str(fake))
    assert issubclass(ModelFileError, ValueError) and issubclass(ModelFileError, ArealError)


def test_an_architecture_transformers_cannot_read_is_refused_with_the_ones_it_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("AREAL_NB_CACHE", str(tmp_path / "cache"))
    file = tmp_path / "odd.gguf"
    _write_gguf(file, "rwkv6")
    assert gguf_architecture(file) == "rwkv6"
    assert "llama" in supported_architectures() and "rwkv6" not in supported_architectures()
    with pytest.raises(ModelFileError, match=r"cannot read the GGUF architecture 'rwkv6'; it reads .*llama"):
        resolve_model_path(str(file))
    assert [p for p in (tmp_path / "cache" / "gguf").iterdir() if p.is_dir()] == []  # nothing half-built


def test_without_the_gguf_package_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("AREAL_NB_CACHE", str(tmp_path / "cache"))
    file = tmp_path / "model.gguf"
    _write_gguf(file, "llama")
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf now raises ImportError
    with pytest.raises(MissingPackageError, match=r"needs the gguf package: pip install 'areal_nb\[gguf\]'"):
        resolve_model_path(str(file))
    assert issubclass(MissingPackageError, ImportError)
