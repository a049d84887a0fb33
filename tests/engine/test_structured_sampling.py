"""Constrained decoding and the recorded sampling distribution of `LocalEngine`, replayed by the
trainer's `masked_token_logprobs`: with the masks the trainer reproduces the recorded log-probs
(grammar, top-k, top-p); without them it does not."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from areal_nb.api import GenerationConfig, InvalidRequestError, ModelRequest, OutputConstraint
from areal_nb.train.sampling_replay import masked_token_logprobs, mismatch_stats, response_allowed

ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}


def _prompt(tokenizer, question: str = "What is 3 + 4?") -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False
    )


def _generate(engine, tokenizer, **gconfig):
    req = ModelRequest(
        input_ids=_prompt(tokenizer),
        gconfig=GenerationConfig(**{"max_new_tokens": 80, **gconfig}).new_with_stop_and_pad_token_ids(
            tokenizer
        ),
    )
    return engine.generate(req)


def _trainer_logprobs(model, response, tokenizer, temperature: float, replay: bool) -> torch.Tensor:
    """What a trainer recomputes: one teacher-forced forward, then (with replay) the recorded masks."""
    prompt, output = list(response.input_tokens), list(response.output_tokens)
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
    allowed = response_allowed(response, tokenizer, logits.shape[-1]) if replay else None
    return masked_token_logprobs(logits, torch.tensor(output), allowed, temperature)


def test_json_schema_output_parses_and_matches_the_schema(local_engine, tiny_tokenizer):
    for _ in range(4):
        response = _generate(
            local_engine,
            tiny_tokenizer,
            temperature=1.0,
            constraint=OutputConstraint("json_schema", schema=ANSWER),
        )
        assert response.stop_reason == "stop"
        text = tiny_tokenizer.decode(response.output_tokens_without_stop)
        jsonschema.validate(json.loads(text), ANSWER)
        masks = response.sampling_masks
        assert masks is not None and masks.constraint.kind == "json_schema"
        assert len(masks.logprobs) == len(masks.kept) == response.output_len
        assert all(kept is None for kept in masks.kept)  # the grammar is replayed, not stored
        # the forced tokens ('{"', 'an', ...) have probability 1 under the masked distribution
        assert masks.logprobs[0] == pytest.approx(0.0, abs=1e-6)


def test_json_object_and_regex_and_tool_call_constraints(local_engine, tiny_tokenizer):
    obj = _generate(local_engine, tiny_tokenizer, constraint=OutputConstraint("json_object"))
    assert isinstance(json.loads(tiny_tokenizer.decode(obj.output_tokens_without_stop)), dict)
    digits = _generate(
        local_engine, tiny_tokenizer, constraint=OutputConstraint("regex", pattern="[0-9]{1,3}")
    )
    assert tiny_tokenizer.decode(digits.output_tokens_without_stop).isdigit()
    call = _generate(
        local_engine,
        tiny_tokenizer,
        max_new_tokens=60,
        constraint=OutputConstraint(
            "tool_call",
            name="add",
            schema={
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999}},
                "required": ["a"],
                "additionalProperties": False,
            },
        ),
    )
    text = tiny_tokenizer.decode(call.output_tokens_without_stop)
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    body = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert body["name"] == "add" and isinstance(body["arguments"]["a"], int)


SMALL_INT = {"type": "integer", "minimum": 0, "maximum": 999}
FUNCTIONS = {
    "add": {
        "type": "object",
        "properties": {"a": SMALL_INT, "b": SMALL_INT},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "shout": {
        "type": "object",
        "properties": {"word": {"type": "string", "enum": ["hi", "bye"]}},
        "required": ["word"],
        "additionalProperties": False,
    },
}


def test_choice_constraint_writes_exactly_one_of_the_choices(local_engine, tiny_tokenizer, reference_model):
    choices = ("positive", "negative", "a|b (not a regex)")
    seen = set()
    for _ in range(12):  # the first token's masked distribution is about 0.54 / 0.25 / 0.21
        response = _generate(
            local_engine,
            tiny_tokenizer,
            temperature=1.5,
            constraint=OutputConstraint("choice", choices=choices),
        )
        text = tiny_tokenizer.decode(response.output_tokens_without_stop)
        assert text in choices and response.stop_reason == "stop"
        seen.add(text)
        trainer = _trainer_logprobs(reference_model, response, tiny_tokenizer, 1.5, replay=True)
        assert float((trainer - torch.tensor(response.sampling_masks.logprobs)).abs().max()) < 1e-4
    assert len(seen) > 1  # sampled, not forced (all 12 alike: p < 1e-3)


def test_any_tool_call_calls_one_of_the_functions_with_its_schema(
    local_engine, tiny_tokenizer, reference_model
):
    constraint = OutputConstraint("any_tool_call", functions=FUNCTIONS)
    names = set()
    for _ in range(6):
        response = _generate(
            local_engine, tiny_tokenizer, temperature=1.0, max_new_tokens=60, constraint=constraint
        )
        text = tiny_tokenizer.decode(response.output_tokens_without_stop)
        assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>"), text
        body = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
        jsonschema.validate(body["arguments"], FUNCTIONS[body["name"]])
        names.add(body["name"])
        trainer = _trainer_logprobs(reference_model, response, tiny_tokenizer, 1.0, replay=True)
        assert float((trainer - torch.tensor(response.sampling_masks.logprobs)).abs().max()) < 1e-4
    assert OutputConstraint.from_dict(constraint.to_dict()) == constraint  # what the record carries


def test_any_tool_call_names_the_tool_whose_schema_cannot_be_enforced():
    functions = {**FUNCTIONS, "dedupe": {"type": "array", "uniqueItems": True}}
    with pytest.raises(InvalidRequestError, match=r"tool 'dedupe'.*uniqueItems"):
        OutputConstraint("any_tool_call", functions=functions).check()
    with pytest.raises(InvalidRequestError, match="non-empty strings"):
        OutputConstraint("choice", choices=()).check()


@pytest.mark.parametrize(
    "schema, feature",
    [({"type": "array", "uniqueItems": True}, "uniqueItems"), ({"not": {"type": "string"}}, "not")],
)
def test_unsupported_schema_features_are_named(local_engine, tiny_tokenizer, schema, feature):
    with pytest.raises(InvalidRequestError, match=feature):
        _generate(local_engine, tiny_tokenizer, constraint=OutputConstraint("json_schema", schema=schema))


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 1.0, "constraint": OutputConstraint("json_schema", schema=ANSWER)},
        {"temperature": 1.5, "top_k": 2},
        {"temperature": 1.0, "top_p": 0.8},
        {"temperature": 0.9, "top_p": 0.9, "constraint": OutputConstraint("json_schema", schema=ANSWER)},
    ],
    ids=["grammar", "top_k", "top_p", "grammar+top_p"],
)
def test_replayed_masks_reproduce_the_recorded_logprobs(
    local_engine, tiny_tokenizer, reference_model, sampling
):
    temperature = sampling["temperature"]
    without, replayed = [], []
    for _ in range(3):
        response = _generate(local_engine, tiny_tokenizer, **sampling)
        recorded = torch.tensor(response.sampling_masks.logprobs)
        trainer = _trainer_logprobs(reference_model, response, tiny_tokenizer, temperature, replay=True)
        assert float((trainer - recorded).abs().max()) < 1e-4
        replayed.append(mismatch_stats(recorded, trainer))
        without.append(
            mismatch_stats(
                recorded,
                _trainer_logprobs(reference_model, response, tiny_tokenizer, temperature, replay=False),
            )
        )
        # the full-vocabulary record is still what a trainer without replay recomputes
        full = _trainer_logprobs(reference_model, response, tiny_tokenizer, temperature, replay=False)
        assert float((full - torch.tensor(response.output_logprobs)).abs().max()) < 1e-4
    mean_without = sum(s["mean_abs_logprob_diff"] for s in without) / len(without)
    print(
        f"{sampling}: mean |Δ log p| without replay {mean_without:.4f}, with replay "
        f"{sum(s['mean_abs_logprob_diff'] for s in replayed) / len(replayed):.2e}; ratio outside clip without replay "
        f"{sum(s['frac_ratio_outside_clip'] for s in without) / len(without):.2f}"
    )
    assert mean_without > 1e-3  # the mask matters: without it the trainer is on another distribution


def test_unmasked_requests_record_no_masks(local_engine, tiny_tokenizer):
    assert _generate(local_engine, tiny_tokenizer, temperature=1.0).sampling_masks is None


def test_the_remote_engine_refuses_structured_output_with_a_reason():
    from areal_nb.engine.remote import refuse_constraint

    refuse_constraint(GenerationConfig())  # plain requests pass
    with pytest.raises(InvalidRequestError, match="engine.type: local"):
        refuse_constraint(GenerationConfig(constraint=OutputConstraint("json_object")))
