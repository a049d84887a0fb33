"""The lab's token lanes: one lane per variant, disagreements highlighted, the pickers re-render."""

from __future__ import annotations

import torch

from areal_nb.session.lab import Comparison
from areal_nb.train.lab import VariantResult
from areal_nb.widgets.compare_model import build_compare_model, compare_html
from areal_nb.widgets.compare_view import CompareView

MASK = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.bool)


def result(name, weights, clipped=(), masked=()):
    w = torch.zeros(2, 5)
    w[MASK] = torch.tensor(weights)
    c, m = torch.zeros(2, 5, dtype=torch.bool), torch.zeros(2, 5, dtype=torch.bool)
    for pos in clipped:
        c[pos] = True
    for pos in masked:
        m[pos] = True
    return VariantResult(
        name=name,
        cfg=None,
        loss=0.0,
        stats={},
        advantages=w.sign(),
        token_weight=w,
        clipped=c,
        masked=m,
        mismatch_weight=torch.ones(2, 5),
        grad_norm=1.0,
        grad=torch.ones(3),
    )


def comparison():
    a = result("a", [0.5, 0.25, -0.5, 0.1, 0.1, 0.1])
    b = result("b", [0.5, -0.25, -0.5, 0.1, 0.1, 0.1], clipped=[(0, 3)])
    c = result("c", [0.4, 0.25, -0.5, 0.1, 0.2, 0.1], masked=[(1, 4)])
    return Comparison(
        {"a": a, "b": b, "c": c},
        torch.arange(10).reshape(2, 5),
        torch.ones(2, 5, dtype=torch.bool),
        MASK,
        torch.tensor([1.0, 0.0]),
    )


def test_lanes_and_disagreements():
    model = build_compare_model(comparison(), 0)
    assert model.positions == [1, 2, 3] and model.names == ["a", "b", "c"]
    assert model.disagree == [False, True, True]  # sign flips at position 2, b clips position 3
    assert build_compare_model(comparison(), 1).disagree == [False, False, True]  # c drops position 4
    assert build_compare_model(comparison(), 0, ["a", "c"]).disagree == [False, False, False]
    html = compare_html(model)
    assert html.count('class="anb-lane"') == 9 and html.count("anb-disagree") == 2
    assert html.count('data-clipped="1"') == 1


def test_view_pickers_rerender():
    view = CompareView(comparison())
    assert view.model.n_disagree == 2 and "anb-disagree" in view.body.value
    view.variant_picker.value = ("a", "c")
    assert view.model.names == ["a", "c"] and "anb-disagree" not in view.body.value
    view.row_picker.value = 1
    assert view.model.row == 1 and view.model.n_disagree == 1
    assert 'data-variant="b"' not in view.to_html()
