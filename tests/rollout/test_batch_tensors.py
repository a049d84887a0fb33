"""`RolloutBatch.to_tensors` equals the rows' own `to_tensor_dict()`s, right-padded, with the
batch's rewards and returns: the batch builds the tensors in one go, never anything else."""

from __future__ import annotations

import pytest
import torch

from areal_nb.api import ModelResponse
from areal_nb.capture import InteractionWithTokenLogpReward, concat_padded_tensors
from areal_nb.rollout.batch import RolloutBatch
from areal_nb.rollout.executor import Episode

EOS = 1


def call(iid, messages, prompt, output, parent, template, reward, version):
    return InteractionWithTokenLogpReward(
        model_response=ModelResponse(
            input_tokens=prompt,
            output_tokens=output,
            output_logprobs=[-0.1 * (i + 1) for i in range(len(output))],
            output_versions=[version] * len(output),
            stop_reason="stop",
            eos_token_ids=[EOS],
        ),
        reward=reward,
        parent=parent,
        chat_template_type=template,
        messages=messages,
        output_message_list=[{"role": "assistant", "content": iid}],
        _interaction_id=iid,
    )


def episode(name, rewards, group_id, sample_id, template):
    """A multi-turn episode whose turns differ in length (so rows need padding)."""
    messages, prompt, calls, parent = [{"role": "user", "content": "q"}], [2, 3, 4 + sample_id], {}, None
    for turn, reward in enumerate(rewards):
        output = [10 + turn + sample_id] * (1 + (sample_id + turn) % 3) + [EOS]
        iid = f"{name}-{turn}"
        calls[iid] = parent = call(iid, list(messages), list(prompt), output, parent, template, reward, turn)
        messages = messages + [{"role": "assistant", "content": iid}, {"role": "user", "content": "again"}]
        prompt = prompt + output + [5, 6]
    return Episode(data={}, group_id=group_id, sample_id=sample_id, version_submitted=0, interactions=calls)


def reference(batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """The per-row construction: each row's own dict, the batch's reward and turn returns."""
    dicts = []
    for row in batch.rows():
        d = dict(row.interaction.to_tensor_dict())
        d["rewards"] = torch.tensor([row.reward], dtype=torch.float32)
        d["turn_returns"] = torch.tensor(
            [row.interaction.turn_returns(batch.discounted(row.episode_index))], dtype=torch.float32
        )
        dicts.append(d)
    out = concat_padded_tensors(dicts)
    out["agent_ids"] = torch.zeros(len(batch.rows()), dtype=torch.long)  # one agent: the calls sent no model
    out["group_ids"] = torch.tensor([r.group_id for r in batch.rows()], dtype=torch.long)
    out["episode_ids"] = torch.tensor([r.episode_index for r in batch.rows()], dtype=torch.long)
    return out


@pytest.mark.parametrize(
    ("template", "style"), [("concat", "concat"), ("concat", "individual"), ("hf", "individual")]
)
@pytest.mark.parametrize("discount", [1.0, 0.5])
def test_to_tensors_equals_the_padded_rows(template, style, discount):
    episodes = [
        episode("a", [0.0, 1.0, None], 0, 0, template),
        episode("b", [1.0], 0, 1, template),
        episode("c", [0.5, 0.0], 1, 0, template),
        episode("d", [0.25, 1.0], 1, 1, template),
    ]
    episodes.insert(
        2, Episode(data={}, group_id=0, sample_id=2, version_submitted=0, rejection_reason="agent_error")
    )
    batch = RolloutBatch(episodes, style=style, discount=discount)
    got, want = batch.to_tensors().tensors(), reference(batch)
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
    assert got["attention_mask"].sum(1).tolist() != [got["attention_mask"].shape[1]] * len(
        got["attention_mask"]
    )


def test_a_batch_without_accepted_episodes_is_refused():
    rejected = Episode(data={}, group_id=0, sample_id=0, version_submitted=0, rejection_reason="cancelled")
    with pytest.raises(ValueError, match="no accepted episodes"):
        RolloutBatch([rejected]).to_tensors()
