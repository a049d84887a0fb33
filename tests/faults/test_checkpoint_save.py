"""A save over an existing checkpoint that fails at any write (a full disk, simulated two ways)
leaves the existing checkpoint exactly as it was: the same files, byte for byte, loading and
continuing as before, and no partial folder beside it."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from areal_nb import Session
from areal_nb.session import checkpoint, checkpoint_files
from areal_nb.session.checkpoint import MANIFEST, SAVE_STEPS, CheckpointError, verify_checkpoint

from .conftest import small_config

pytestmark = pytest.mark.slow


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name != folder.name)


@pytest.fixture(scope="module")
def session():
    with Session(small_config(seed=7)) as s:
        s.step()
        yield s


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("step", SAVE_STEPS)
def test_a_save_failing_at_any_step_keeps_the_old_checkpoint(session, tmp_path, monkeypatch, step):
    old = session.save(tmp_path / "ckpt")
    before = snapshot(old)
    session.actor.steps_done += 1  # the new save would differ (history, state)
    try:
        monkeypatch.setattr(checkpoint, step, full_disk)
        with pytest.raises(OSError, match="No space left"):
            session.save(old)
    finally:
        session.actor.steps_done -= 1
    assert snapshot(old) == before
    assert siblings(old) == []  # the partial new checkpoint (and the renamed-aside old one) are gone
    verify_checkpoint(old)


def test_a_failed_rename_into_place_puts_the_old_checkpoint_back(session, tmp_path, monkeypatch):
    old = session.save(tmp_path / "ckpt")
    before = snapshot(old)
    real_replace = checkpoint_files.os.replace
    calls = []

    def second_rename_fails(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # the new folder onto the target's name
            raise OSError(errno.EIO, "I/O error")
        return real_replace(src, dst)

    monkeypatch.setattr(checkpoint_files.os, "replace", second_rename_fails)  # (the rename into place)
    with pytest.raises(OSError, match="I/O error"):
        session.save(old)
    assert snapshot(old) == before and siblings(old) == []


def test_save_refuses_a_target_that_is_not_a_checkpoint(session, tmp_path):
    stray = tmp_path / "ckpt"
    stray.mkdir()
    (stray / "model").write_text("not a model folder")
    with pytest.raises(CheckpointError, match=r"holds files that are not a checkpoint's \(model\)"):
        session.save(stray)
    assert (stray / "model").read_text() == "not a model folder"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(CheckpointError, match="not a folder"):
        session.save(a_file)
    with pytest.raises(CheckpointError, match="not a folder"):
        session.save(a_file / "sub")


def test_a_stray_file_in_an_old_checkpoint_is_replaced_by_a_complete_save(session, tmp_path):
    old = session.save(tmp_path / "ckpt")
    shutil.rmtree(old / "model")
    (old / "model").write_text("stray")
    session.save(old)
    assert (old / "model" / "model.safetensors").is_file()
    verify_checkpoint(old)


FILL_DISK = textwrap.dedent('''
    """Save over an existing checkpoint with the file-size limit at each size a file of the save
    reaches: every one of those saves must fail, and leave the old checkpoint as it was."""
    import json, resource, signal, sys
    from pathlib import Path


    def main():
        sys.path.insert(0, sys.argv[3])
        from tests.faults.conftest import small_config
        from areal_nb import Session

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        out = Path(sys.argv[1])
        limits = json.loads(sys.argv[2])
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        results = []
        with Session(small_config(seed=7)) as s:
            s.step()
            s.save(out)
            s.step()  # what the failing saves would have written differs
            for limit in limits:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
                try:
                    s.save(out)
                    results.append([limit, None])
                except BaseException as e:
                    results.append([limit, f"{type(e).__name__}: {e}"[:200]])
                finally:
                    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        print(json.dumps(results))


    if __name__ == "__main__":  # (the reward workers, spawned, import this file again)
        main()
''')


def test_a_full_disk_at_each_file_keeps_the_old_checkpoint_loading_and_continuing(session, tmp_path):
    """The file-size limit set just below each file's size in turn (so the first file of at least
    that size fails, whichever writer writes it: safetensors, torch.save, JSON, YAML), in a
    process of its own; then the old checkpoint is loaded and continues exactly like a copy made
    before any of it."""
    probe = session.save(tmp_path / "probe")
    sizes = sorted({entry["size"] for entry in json.loads((probe / MANIFEST).read_text())["files"].values()})
    limits = sorted({0, *(size - 1 for size in sizes if size > 0)})
    target = tmp_path / "run" / "ckpt"
    script = tmp_path / "fill_disk.py"
    script.write_text(FILL_DISK)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(script), str(target), json.dumps(limits), str(root)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert [limit for limit, error in results if error is None] == [], results
    assert siblings(target) == []
    verify_checkpoint(target)
    # the subprocess's first save is the old checkpoint: a fresh session saving at the same step
    # would not give the same bytes (RNG), so compare continuations instead: the faulted folder
    # against a copy loaded as it is
    pristine = tmp_path / "pristine"
    shutil.copytree(target, pristine)
    with Session.load(pristine) as a:
        batch = a.rollout()
        stats_a = a.train_step(batch)
        weights_a = {k: v.clone() for k, v in a.actor.model.state_dict().items()}
    with Session.load(target) as b:
        assert (b.step_count, b.version) == (1, 1)
        stats_b = b.train_step(batch)
        for key in ("loss", "adv_mean", "grad_norm", "entropy"):
            assert stats_b[key] == pytest.approx(stats_a[key], rel=1e-6, abs=1e-7), key
        for k, v in b.actor.model.state_dict().items():
            torch.testing.assert_close(v, weights_a[k], rtol=0, atol=0)
