"""RolloutBatch.show_tree/show_tokens/show_rewards: drawn by widgets, a layer above rollout."""

from __future__ import annotations

import pytest

from .conftest import episode


def test_batch_views_are_the_widgets_views(captured, tiny_tokenizer):
    import areal_nb.widgets as widgets
    from areal_nb.rollout import RolloutBatch

    a, b = captured.concat_a, captured.concat_b
    batch = RolloutBatch([episode(a, 0, 0), episode(b, 0, 1)], style="concat", tokenizer=tiny_tokenizer)
    assert isinstance(batch.show_tree(1), widgets.TreeView)
    assert isinstance(batch.show_tokens(0), widgets.TokenView)
    assert isinstance(batch.show_rewards(0), widgets.RewardView)


def test_without_the_widgets_a_view_says_what_to_import(captured, monkeypatch):
    from areal_nb.rollout import RolloutBatch, batch as batch_module

    monkeypatch.setattr(batch_module, "_BATCH_VIEWS", {})  # as if areal_nb.widgets was never imported
    batch = RolloutBatch([episode(captured.concat_a)])
    with pytest.raises(RuntimeError, match=r"batch.show_tree\(\) is drawn by areal_nb.widgets.*import areal_nb.widgets"):
        batch.show_tree(0)
    with pytest.raises(ValueError, match="unknown batch view 'table'"):
        batch_module.register_batch_view("table", lambda b, i: None)
