"""Every file a checkpoint holds, deleted, truncated or corrupted: `Session.load` raises
`CheckpointError` naming that file, before it starts anything; and a load that fails after
starting leaves no thread, port or process behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from areal_nb import Session
from areal_nb.session import checkpoint
from areal_nb.session.checkpoint import MANIFEST, CheckpointError, adopt_checkpoint, verify_checkpoint

from .conftest import port_is_free, small_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A checkpoint after one training step (optimizer state present), with a Python dataset
    (so data/ is in it too)."""
    rows = [
        {"messages": [{"role": "user", "content": f"{i} + {i} = ?"}], "answer": str(2 * i)} for i in range(8)
    ]
    path = tmp_path_factory.mktemp("ckpt") / "ckpt"
    with Session(
        small_config(seed=5),
        dataset=rows,
        agent__workflow="areal_nb.agents.chat_agent.ChatAgent",
        agent__workflow_kwargs={"reward_fn": "areal_nb.reward.functions.math_answer"},
    ) as s:
        s.step()
        s.save(path)
    return path


def files_of(folder: Path) -> list[str]:
    return sorted(json.loads((folder / MANIFEST).read_text())["files"])


def test_the_manifest_lists_every_file_the_checkpoint_holds(saved):
    listed = files_of(saved)
    on_disk = sorted(p.relative_to(saved).as_posix() for p in saved.rglob("*") if p.is_file())
    assert on_disk == sorted([*listed, MANIFEST])
    assert {
        "config.yaml",
        "state.pt",
        "history.json",
        "model/config.json",
        "model/model.safetensors",
        "model/tokenizer.json",
        "data/train.jsonl",
    } <= set(listed)
    verify_checkpoint(saved)


def _truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def _corrupt(file: Path) -> None:
    """Same size, different bytes in the middle (a bit rot no length check can see)."""
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    for i in range(middle, min(middle + 16, len(data))):
        data[i] ^= 0x5A
    file.write_bytes(bytes(data))


def _delete(file: Path) -> None:
    file.unlink()


DAMAGE = {"deleted": _delete, "truncated": _truncate, "corrupted": _corrupt}


def _damaged_copy(saved: Path, tmp_path: Path, rel: str, how: str) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(saved, copy)
    DAMAGE[how](copy / rel)
    return copy


def _refused_naming(copy: Path, rel: str, leftovers) -> CheckpointError:
    started = []
    original = Session.start

    def record_start(self):  # the checks come before anything starts
        started.append(True)
        return original(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Session, "start", record_start)
        with pytest.raises(CheckpointError) as info:
            Session.load(copy)
    assert started == [], "Session.load started the Session before refusing the checkpoint"
    assert rel in str(info.value).replace(str(copy) + "/", ""), str(info.value)
    assert leftovers.check(timeout=2) == ([], [])
    return info.value


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_every_file_damaged_is_refused_naming_it(saved, tmp_path, how, leftovers):
    for rel in files_of(saved):
        case = tmp_path / f"{rel.replace('/', '_')}"
        case.mkdir()
        _refused_naming(_damaged_copy(saved, case, rel, how), rel, leftovers)


def test_a_damaged_manifest_is_refused_naming_it(saved, tmp_path, leftovers):
    for how in sorted(DAMAGE):
        if how == "deleted":
            continue  # an old checkpoint: test_without_a_manifest below
        case = tmp_path / how
        case.mkdir()
        _refused_naming(_damaged_copy(saved, case, MANIFEST, how), MANIFEST, leftovers)


def test_without_a_manifest_load_refuses_and_says_how_to_adopt(saved, tmp_path, leftovers):
    plain = tmp_path / "plain"
    shutil.copytree(saved, plain)
    (plain / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=r"manifest.json: missing.*adopt_checkpoint\("):
        Session.load(plain)
    assert leftovers.check(timeout=2) == ([], [])
    adopt_checkpoint(plain)
    assert files_of(plain) == files_of(saved)
    verify_checkpoint(plain)


@pytest.mark.parametrize("how", ["deleted", "truncated"])
def test_adopting_checks_every_file_it_can(saved, tmp_path, how):
    """Without a manifest to compare with, a missing or cut file is still refused, naming the file
    or the model folder it belongs to (a changed byte cannot be seen: why load refuses these)."""
    plain = tmp_path / "plain"
    shutil.copytree(saved, plain)
    (plain / MANIFEST).unlink()
    structural = [
        "config.yaml",
        "state.pt",
        "history.json",
        "model/config.json",
        "model/model.safetensors",
        "model/tokenizer.json",
    ]
    if how == "truncated":
        structural.remove("config.yaml")  # half a config.yaml is a valid config: the manifest's job
    for rel in structural:
        copy = tmp_path / f"{how}_{rel.replace('/', '_')}"
        shutil.copytree(plain, copy)
        DAMAGE[how](copy / rel)
        with pytest.raises(CheckpointError) as info:
            adopt_checkpoint(copy)
        message = str(info.value)
        assert rel in message or (rel.startswith("model/") and str(copy / "model") in message), message
        assert not (copy / MANIFEST).exists()


def test_weights_that_do_not_fit_the_model_config_are_refused(saved, tmp_path):
    """A consistent manifest over an inconsistent model: config.json promising another size."""
    copy = tmp_path / "ckpt"
    shutil.copytree(saved, copy)
    config_file = copy / "model" / "config.json"
    model_config = json.loads(config_file.read_text())
    model_config["hidden_size"] *= 2
    config_file.write_text(json.dumps(model_config))
    checkpoint._write_manifest(copy)  # rewritten: only the shapes can tell
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors: weight .* has shape .*model/config.json gives"
    ):
        Session.load(copy)


def test_a_load_that_fails_after_starting_stops_everything(saved, leftovers, monkeypatch):
    from areal_nb.session import builder

    seen = {}
    build_proxy = builder.build_proxy

    def recording_build_proxy(*args, **kwargs):
        proxy = build_proxy(*args, **kwargs)
        seen["url"] = proxy.url
        return proxy

    def failing_restore(actor, engine, state):
        assert port_is_free(seen["url"]) is False  # the proxy is up when the restore fails
        raise RuntimeError("restore failed on purpose")

    monkeypatch.setattr(builder, "build_proxy", recording_build_proxy)
    monkeypatch.setattr("areal_nb.session.leader.restore", failing_restore)
    with pytest.raises(RuntimeError, match="on purpose"):
        Session.load(saved)
    assert port_is_free(seen["url"])
    assert leftovers.check() == ([], [])
