import pytest

from areal_nb.api import GenerationConfig, ModelRequest, ModelResponse

EOS, PAD = 2, 0


def response(tokens, stop_reason="stop"):
    return ModelResponse(
        input_tokens=[5, 6], output_tokens=tokens, stop_reason=stop_reason, eos_token_ids=[EOS, PAD]
    )


def test_without_stop_strips_trailing_eos_and_pad_run():
    assert response([7, 8, EOS]).output_tokens_without_stop == [7, 8]
    assert response([7, 8, EOS, PAD, PAD]).output_tokens_without_stop == [7, 8]


def test_stop_string_output_without_eos_does_not_raise():
    # AReaL raises here; a stop string ends text without EOS.
    assert response([7, 8, 9]).output_tokens_without_stop == [7, 8, 9]


def test_truncated_output_kept_as_is():
    assert response([7, EOS, 8], "length").output_tokens_without_stop == [7, EOS, 8]
    assert response([7], "abort").output_tokens_without_stop == [7]


def test_all_eos_output_becomes_empty_reply():
    assert response([EOS]).output_tokens_without_stop == []
    assert response([]).output_tokens_without_stop == []


def test_end_with_stop_and_lengths():
    r = response([7, EOS])
    assert r.end_with_stop and r.input_len == 2 and r.output_len == 2
    assert not response([7]).end_with_stop


def test_response_without_stop_ids_is_a_clear_error():
    with pytest.raises(ValueError, match="tokenizer or eos_token_ids"):
        _ = ModelResponse(output_tokens=[1]).output_tokens_without_stop


def test_generation_config_new_and_openai_args():
    g = GenerationConfig(max_new_tokens=32, temperature=0.7, stop="###")
    assert g.stop == ["###"]
    assert g.new(greedy=True).greedy and not g.greedy
    with pytest.raises(TypeError, match="max_new_tokenz"):
        g.new(max_new_tokenz=3)
    assert g.to_openai_args_dict() == {
        "n": 1,
        "temperature": 0.7,
        "top_p": 1.0,
        "stop": ["###"],
        "max_completion_tokens": 32,
    }
    assert g.to_openai_args_dict("responses") == {"temperature": 0.7, "top_p": 1.0, "max_output_tokens": 32}
    assert g.new(greedy=True).to_openai_args_dict("openai-agents")["temperature"] == 0.0
    with pytest.raises(ValueError):
        g.to_openai_args_dict("grpc")


def test_stop_and_pad_ids_from_tokenizer():
    class Tok:
        eos_token_id, pad_token_id = EOS, PAD

    assert GenerationConfig(stop_token_ids=[9]).new_with_stop_and_pad_token_ids(Tok()).stop_token_ids == [
        9,
        PAD,
        EOS,
    ]


def test_request_copy_is_independent():
    r = ModelRequest(input_ids=[1, 2], metadata={"a": 1})
    c = r.copy()
    c.input_ids.append(3)
    c.metadata["b"] = 2
    assert r.input_ids == [1, 2] and r.metadata == {"a": 1} and c.rid == r.rid


def test_export_style_check_is_the_one_concat_rule():
    from areal_nb.api import can_export_concat, check_export_style

    check_export_style("individual", {"a": "hf", "b": "concat"})  # individual takes any template
    check_export_style("concat", {"a": "concat", "b": "concat"})
    check_export_style("concat")  # no calls to check yet: only the style's name
    with pytest.raises(
        ValueError, match=r"Invalid export style 'tree'; expected one of \('individual', 'concat'\)"
    ):
        check_export_style("tree")
    with pytest.raises(ValueError, match=r"'concat' style .* 1 of 2 are not \(first: 'b'\)"):
        check_export_style("concat", {"a": "concat", "b": "hf"})
    assert can_export_concat(["concat", "concat"]) and not can_export_concat(["concat", "hf"])


def test_import_object_reads_both_spellings_and_walks_attributes_after_the_colon():
    import json.decoder

    from areal_nb.api import import_object

    assert import_object("json.decoder.JSONDecoder") is json.decoder.JSONDecoder
    assert import_object("json.decoder:JSONDecoder") is json.decoder.JSONDecoder
    assert import_object("json.decoder:JSONDecoder.decode") is json.decoder.JSONDecoder.decode


@pytest.mark.parametrize(
    "path, error, message",
    [
        ("justaname", ValueError, "'justaname' is not an import path"),
        (":name", ValueError, "is not an import path"),
        ("json.decoder:", ValueError, "is not an import path"),
        ("no_such_pkg.thing", ImportError, "cannot import module 'no_such_pkg'"),
        ("json.decoder.Nope", ImportError, "module 'json.decoder' has no attribute 'Nope'"),
        (
            "json.decoder:JSONDecoder.nope",
            ImportError,
            "module 'json.decoder' has no attribute 'JSONDecoder.nope'",
        ),
    ],
)
def test_import_object_says_what_is_missing(path, error, message):
    from areal_nb.api import import_object

    with pytest.raises(error, match=message):
        import_object(path)


def test_a_checked_generation_config_is_trusted_until_it_changes():
    from areal_nb.api import GenerationConfig, InvalidRequestError

    config = GenerationConfig(temperature=0.7, top_p=0.9)
    assert not config.checked
    assert config.check() is config and config.checked
    config.top_p = 0.0  # assigned after the check: checked again by the next door
    assert not config.checked
    with pytest.raises(InvalidRequestError, match=r"top_p must be in \(0, 1\]"):
        config.check()
    assert not config.checked
    assert not GenerationConfig().check().new(temperature=0.5).checked  # a copy is its own config


def test_the_engine_protocol_declares_what_the_layers_above_call():
    """Every method or attribute the session, rollout, proxy, capture and widgets layers use on an
    engine is part of `InferenceEngine`: no caller reaches past the protocol."""
    import re
    from pathlib import Path

    import areal_nb
    from areal_nb.api import InferenceEngine

    root = Path(areal_nb.__file__).parent
    use = re.compile(
        r"(?:^|[^.\w`]|self\.|session\.|self\._)engine\.(\w+)|(?:has|get)attr\(\w*engine, \"(\w+)\""
    )
    used: set[str] = set()
    for layer in ("session", "rollout", "proxy", "capture", "widgets", "cli", "agents"):
        for path in (root / layer).rglob("*.py"):
            for match in use.finditer(path.read_text()):
                used.add(match.group(1) or match.group(2))
    declared = {name for name in dir(InferenceEngine) if not name.startswith("_")} | set(
        InferenceEngine.__annotations__
    )
    assert {"agenerate", "max_context", "rng_state", "set_rng_state"} <= used  # the scan sees the callers
    assert used <= declared, f"used on engines but not declared by InferenceEngine: {sorted(used - declared)}"


def test_no_caller_probes_an_engine_for_what_it_can_do():
    """What an engine can do is declared by `InferenceEngine` (with a default) and stated by each
    engine: nothing in the package asks an engine with getattr/hasattr, and no layer but the
    engine factory branches on `engine.type`."""
    import re
    from pathlib import Path

    import areal_nb

    root = Path(areal_nb.__file__).parent
    probe = re.compile(r"(?:getattr|hasattr)\(\s*[\w.]*engine\b")
    type_branch = re.compile(r"engine\.type\s*(?:==|!=|in\b|not in\b)")
    probes, branches = [], []
    for path in root.rglob("*.py"):
        text = path.read_text()
        probes += [f"{path.relative_to(root)}: {m.group(0)}" for m in probe.finditer(text)]
        if path.relative_to(root).as_posix() != "engine/factory.py":
            branches += [f"{path.relative_to(root)}: {m.group(0)}" for m in type_branch.finditer(text)]
    engine_config = (root / "config" / "engine.py").read_text()  # EngineConfig
    branches += re.findall(r"self\.type\s*(?:==|!=)", engine_config)
    assert probes == [] and branches == []


def test_every_engine_states_its_capabilities():
    """Each engine class of the package subclasses `InferenceEngine` and states every capability
    itself (a class attribute, or set per instance where it depends on how the engine was made),
    or inherits it from a package base that states it (the test engines share `StubEngine`)."""
    import inspect
    import re

    from areal_nb.api import InferenceEngine
    from areal_nb.engine.agent_engines import AgentEngines
    from areal_nb.engine.local import LocalEngine
    from areal_nb.engine.sglang_client import SGLangEngine
    from areal_nb.session.evaluation import GreedyEngine
    from areal_nb.testing import ScriptedEngine
    from areal_nb.testing.served_stub import ServedStub

    capabilities = {name for name in vars(InferenceEngine) if not name.startswith("_")} - {
        "agenerate", "get_version", "set_version", "pause", "resume", "update_weights", "close",
        "rng_state", "set_rng_state",
    }  # fmt: skip
    assert capabilities == {
        "max_context", "serves_lora_adapters", "weights_may_differ", "records_sampling_masks",
        "serves_models_in_process", "shares_weights", "stats", "abort", "abort_all", "drop_caches",
    }  # fmt: skip
    for cls in (LocalEngine, SGLangEngine, AgentEngines, GreedyEngine, ScriptedEngine, ServedStub):
        assert InferenceEngine in cls.__mro__, cls
        own_classes = cls.__mro__[: cls.__mro__.index(InferenceEngine)]  # the class and its package bases
        source = "".join(inspect.getsource(c) for c in own_classes)
        unstated = {c for c in capabilities if not re.search(rf"\b{c}\b\s*(?::[^=\n]*)?=|def {c}\(", source)}
        assert not unstated, f"{cls.__name__} leaves {sorted(unstated)} to the default"
    assert LocalEngine.records_sampling_masks and LocalEngine.serves_models_in_process
    assert not SGLangEngine.records_sampling_masks and not SGLangEngine.serves_models_in_process
    assert not LocalEngine.serves_lora_adapters and not LocalEngine.weights_may_differ


def test_the_factory_says_what_each_engine_type_can_do():
    from areal_nb.config import ConfigError, load_config
    from areal_nb.engine.factory import engine_class

    assert engine_class("local").records_sampling_masks
    assert not engine_class("remote").records_sampling_masks
    with pytest.raises(ConfigError, match="replay_sampling_masks needs engine.type 'local'"):
        load_config(None, ["engine.type=sglang", "actor.replay_sampling_masks=true"])
    assert load_config(None, ["actor.replay_sampling_masks=true"]).actor.replay_sampling_masks


def test_the_test_and_evaluation_engines_follow_the_protocol(tiny_tokenizer):
    from areal_nb.api import InferenceEngine
    from areal_nb.session.evaluation import GreedyEngine
    from areal_nb.testing import ScriptedEngine

    scripted = ScriptedEngine(tiny_tokenizer, "4")
    for engine in (scripted, GreedyEngine(scripted)):
        assert isinstance(engine, InferenceEngine)
        assert engine.max_context is None and engine.rng_state() is None
