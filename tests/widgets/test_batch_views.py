"""RolloutBatch.show_tree/show_tokens/show_rewards: drawn by widgets, a layer above rollout, through
the viewer the batch is built with (no registration on import)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import episode


def test_batch_views_are_the_widgets_views(captured, tiny_tokenizer):
    from areal_nb import widgets
    from areal_nb.rollout import RolloutBatch

    a, b = captured.concat_a, captured.concat_b
    batch = RolloutBatch(
        [episode(a, 0, 0), episode(b, 0, 1)],
        style="concat",
        tokenizer=tiny_tokenizer,
        viewer=widgets.view_batch,
    )
    assert isinstance(batch.show_tree(1), widgets.TreeView)
    assert isinstance(batch.show_tokens(0), widgets.TokenView)
    assert isinstance(batch.show_rewards(0), widgets.RewardView)
    assert batch.filter(lambda ep: True).viewer is widgets.view_batch  # derived batches keep it
    with pytest.raises(ValueError, match="unknown batch view 'table'"):
        widgets.view_batch(batch, "table", 0)


def test_a_batch_without_a_viewer_says_how_to_get_one(captured):
    import areal_nb.widgets  # noqa: F401  importing the widgets changes nothing for a batch
    from areal_nb.rollout import RolloutBatch

    batch = RolloutBatch([episode(captured.concat_a)])
    with pytest.raises(
        RuntimeError, match=r"batch.show_tree\(\) needs the widgets.*areal_nb.widgets.view_batch"
    ):
        batch.show_tree(0)


@pytest.mark.server  # a fresh interpreter in a subprocess
def test_importing_areal_nb_imports_no_widgets():
    code = "import areal_nb, areal_nb.rollout.batch, sys; print('areal_nb.widgets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
