"""Hand-built interactions for pure-logic tests (token ids are arbitrary; EOS is 2, pad 0)."""

from __future__ import annotations

from areal_nb.api import ModelResponse
from areal_nb.capture import InteractionWithTokenLogpReward

EOS, PAD = 2, 0


def response(input_tokens, output_tokens, stop_reason="stop", logprob=-0.5, version=0) -> ModelResponse:
    return ModelResponse(
        input_tokens=list(input_tokens),
        output_tokens=list(output_tokens),
        output_logprobs=[logprob] * len(output_tokens),
        output_versions=[version] * len(output_tokens),
        stop_reason=stop_reason,
        eos_token_ids=[EOS, PAD],
    )


def call(
    iid,
    messages,
    output_text,
    input_tokens=(),
    output_tokens=(),
    *,
    parent=None,
    template="concat",
    reward=None,
    stop_reason="stop",
    logprob=-0.5,
    version=0,
) -> InteractionWithTokenLogpReward:
    """A completed call whose output message is `{"role": "assistant", "content": output_text}`."""
    return InteractionWithTokenLogpReward(
        model_response=response(input_tokens, output_tokens, stop_reason, logprob, version),
        reward=reward,
        parent=parent,
        chat_template_type=template,
        messages=[dict(m) for m in messages],
        output_message_list=[{"role": "assistant", "content": output_text}],
        _interaction_id=iid,
    )


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}
