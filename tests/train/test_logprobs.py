import pytest
import torch
import torch.nn.functional as F

from areal_nb.train import compute_token_logprobs, compute_token_logprobs_and_entropy


def _reference_row_logprobs(model, ids: list[int], temperature: float) -> list[float]:
    """Plain unpadded forward of one row; position t: log p(ids[t] | ids[:t]), position 0: 0."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double() / temperature
    logp = F.log_softmax(logits, dim=-1)
    return [0.0] + [logp[t - 1, ids[t]].item() for t in range(1, len(ids))]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recomputed_logprobs_match_plain_forward_with_right_padding(tiny_qwen2, temperature):
    rows = [[2, 7, 9, 11, 30, 1], [3, 4], [5, 6, 8, 40]]
    width = max(map(len, rows))
    input_ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.bool)
    with torch.no_grad():
        got = compute_token_logprobs(tiny_qwen2, input_ids, attention, temperature)
    assert got.shape == (3, width) and got.dtype == torch.float32
    for i, row in enumerate(rows):
        expected = _reference_row_logprobs(tiny_qwen2, row, temperature)
        assert got[i, : len(row)].tolist() == pytest.approx(expected, abs=1e-6)
        assert got[i, 0].item() == 0.0


def test_entropy_per_token(tiny_qwen2):
    ids = torch.tensor([[2, 7, 9, 11]])
    logp, entropy = compute_token_logprobs_and_entropy(tiny_qwen2, ids, torch.ones(1, 4, dtype=torch.bool))
    assert logp.requires_grad and not entropy.requires_grad
    with torch.no_grad():
        dist = F.log_softmax(tiny_qwen2(input_ids=ids).logits[0].double(), dim=-1)
    expected = [0.0] + [-(dist[t].exp() * dist[t]).sum().item() for t in range(3)]
    assert entropy[0].tolist() == pytest.approx(expected, abs=1e-5)


def test_bad_temperature(tiny_qwen2):
    with pytest.raises(ValueError, match="temperature"):
        compute_token_logprobs(tiny_qwen2, torch.tensor([[1, 2]]), None, temperature=0.0)
