"""One error tree (`areal_nb.errors`) and one renderer for the three HTTP dialects.

- every exception class areal_nb defines (in any of its modules) derives from `ArealError` (its
  warnings from `ArealWarning`), and
  the tree in `areal_nb.errors`' docstring names each of them;
- the proxy's OpenAI and Anthropic routes and the engine-server's SGLang `/generate` answer their
  errors with exactly what `render_error` gives, on real apps through httpx's ASGI transport.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pickle
import pkgutil
import re

import httpx
import pytest

import areal_nb
from areal_nb import errors
from areal_nb.errors import ArealError, ArealWarning, render_error

# Run as scripts or with side effects on import; nothing in them defines an exception.
_NOT_IMPORTED = {"areal_nb.cli.__main__"}


def _all_modules() -> list[str]:
    names = [areal_nb.__name__]
    for info in pkgutil.walk_packages(areal_nb.__path__, prefix="areal_nb."):
        if info.name not in _NOT_IMPORTED:
            names.append(info.name)
    return names


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in areal_nb, public (its name and its module's path have no
    leading underscore), by `module.Name` of where it is defined."""
    found: dict[str, type[BaseException]] = {}
    for name in _all_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if not (inspect.isclass(value) and issubclass(value, BaseException)):
                continue
            if not value.__module__.startswith("areal_nb") or attr.startswith("_"):
                continue
            if any(part.startswith("_") for part in value.__module__.split(".")):
                continue
            found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_exception_areal_nb_defines_derives_from_areal_error():
    classes = _exception_classes()
    # the walk saw the package: the base, a class of each family and the ones re-exported from their old homes
    for name in (
        "ConfigError",
        "InvalidRequestError",
        "ProxyError",
        "BadRequest",
        "RewardError",
        "EpisodeRejected",
    ):
        assert f"areal_nb.errors.{name}" in classes
    strays = sorted(
        name
        for name, cls in classes.items()
        if not issubclass(cls, ArealWarning if issubclass(cls, Warning) else ArealError)
    )
    assert strays == [], (
        f"outside the tree (derive them from areal_nb.errors.ArealError / ArealWarning): {strays}"
    )


def test_the_docstring_tree_names_every_exception_of_the_module():
    defined = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == errors.__name__
    }
    drawn = set(re.findall(r"[├└]── (\w+)", errors.__doc__)) | {"ArealError", "ArealWarning"}
    assert defined == drawn
    assert defined <= set(errors.__all__)


@pytest.mark.parametrize(
    "old_home, name",
    [
        ("areal_nb.api", "InvalidRequestError"),
        ("areal_nb.config", "ConfigError"),
        ("areal_nb.openai.messages", "CompletionRequestError"),
        ("areal_nb.openai.anthropic", "AnthropicRequestError"),
        ("areal_nb.proxy.errors", "ProxyError"),
        ("areal_nb.proxy.client", "ProxyRequestError"),
        ("areal_nb.engine.server_app", "BadRequest"),
        ("areal_nb.engine.remote", "ServerDownError"),
        ("areal_nb.reward.async_wrapper", "RewardTimeoutError"),
        ("areal_nb.session.rejections", "RolloutRejectedError"),
    ],
)
def test_old_imports_give_the_same_classes(old_home, name):
    assert getattr(importlib.import_module(old_home), name) is getattr(errors, name)


def test_each_error_keeps_its_builtin_base():
    # `except ValueError` around a config load, `except TypeError` around messages, ... still catch them
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.InvalidRequestError, ValueError)
    assert issubclass(errors.BadRequest, ValueError)
    assert issubclass(errors.MessageTypeError, TypeError)
    assert issubclass(errors.RewardValueError, TypeError)
    assert issubclass(errors.RewardTimeoutError, RuntimeError)
    # the three kinds of bad request are one family: 400 invalid_request
    for cls in (errors.CompletionRequestError, errors.AnthropicRequestError, errors.BadRequest):
        assert issubclass(cls, errors.InvalidRequestError)
        assert (cls("x").status, cls("x").code) == (400, "invalid_request")


def test_render_error_shapes():
    bad = errors.InvalidRequestError("temperature must be in range")
    assert render_error(bad, "openai").body == {
        "error": {
            "message": "temperature must be in range",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_request",
        }
    }
    assert render_error(bad, "responses").body == render_error(bad, "openai").body
    assert render_error(bad, "openai").headers == {"x-should-retry": "false"}
    assert render_error(bad, "anthropic").body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "temperature must be in range"},
    }
    assert render_error(bad, "sglang").body == {
        "error": {"message": "temperature must be in range", "code": 400}
    }
    assert render_error(errors.ContractViolation("unknown field `x`"), "sglang").body == {
        "error": {"message": "unknown field `x`", "code": 400}
    }
    busy = errors.ProxyError(429, "no capacity", "no_capacity")
    assert render_error(busy, "openai").status == 429
    assert render_error(busy, "openai").headers == {}  # the SDKs may retry a 429
    later = errors.ProxyError(429, "no capacity", "no_capacity", retry_after=1)
    assert render_error(later, "openai").headers == {"retry-after": "1"}
    assert render_error(later, "anthropic").headers == {"retry-after": "1"}
    assert render_error(busy, "anthropic").body["error"]["type"] == "rate_limit_error"
    with pytest.raises(ValueError, match="unknown error dialect"):
        render_error(bad, "grpc")  # type: ignore[arg-type]


# ------------------------------------------------------------------ the dialects on real apps

ADMIN = "errors-test-admin-key"


async def _proxy_session(client: httpx.AsyncClient) -> dict[str, str]:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    assert (await client.post("/grant_capacity", headers=admin)).status_code == 200
    started = await client.post("/rl/start_session", headers=admin, json={"task_id": "t"})
    assert started.status_code == 200, started.text
    return {"Authorization": f"Bearer {started.json()['api_key']}"}


@pytest.fixture
def proxy_app(tiny_tokenizer):
    from areal_nb.proxy import ProxySettings, create_app
    from areal_nb.testing import ScriptedEngine

    return create_app(
        ScriptedEngine(tiny_tokenizer, "The answer is 4"), tiny_tokenizer, ProxySettings(admin_api_key=ADMIN)
    )


def test_openai_dialect_on_the_proxy(proxy_app):
    asyncio.run(_test_openai_dialect_on_the_proxy(proxy_app))


async def _test_openai_dialect_on_the_proxy(proxy_app):
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=proxy_app), base_url="http://proxy"
    ) as client:
        key = await _proxy_session(client)
        # the capture layer refuses it (CompletionRequestError), the route renders it
        r = await client.post(
            "/v1/chat/completions",
            headers=key,
            json={
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
                "max_completion_tokens": 8,
            },
        )
        assert r.status_code == 400
        message = r.json()["error"]["message"]
        assert "cannot be set at the same time" in message
        expected = render_error(errors.CompletionRequestError(message), "openai")
        assert r.json() == expected.body
        assert r.headers["x-should-retry"] == "false"
        # an unknown key: 401 authentication_error, same renderer
        r = await client.post(
            "/v1/chat/completions",
            headers={"Authorization": "Bearer nobody-has-this-key"},
            json={"messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
        assert (
            r.json()
            == render_error(
                errors.ProxyError(401, r.json()["error"]["message"], r.json()["error"]["code"]), "openai"
            ).body
        )


def test_anthropic_dialect_on_the_proxy(proxy_app):
    asyncio.run(_test_anthropic_dialect_on_the_proxy(proxy_app))


async def _test_anthropic_dialect_on_the_proxy(proxy_app):
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=proxy_app), base_url="http://proxy"
    ) as client:
        key = await _proxy_session(client)
        r = await client.post(
            "/v1/messages",
            headers=key,
            json={
                "model": "m",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": [{"type": "no_such_block", "text": "hi"}]}],
            },
        )
        assert r.status_code == 400
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"].startswith("invalid Anthropic request: ")
        assert body == render_error(errors.AnthropicRequestError(body["error"]["message"]), "anthropic").body
        assert r.headers["x-should-retry"] == "false"


def test_sglang_dialect_on_the_engine_server():
    asyncio.run(_test_sglang_dialect_on_the_engine_server())


async def _test_sglang_dialect_on_the_engine_server():
    from areal_nb.engine.server_app import create_engine_app
    from areal_nb.testing.served_stub import ServedStub

    app = create_engine_app(ServedStub())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine") as client:
        # a key outside SGLang's closed sampling_params set
        r = await client.post("/generate", json={"input_ids": [1, 2], "sampling_params": {"max_tokens": 8}})
        assert r.status_code == 400
        assert "max_tokens" in r.json()["error"]["message"]
        assert r.json() == render_error(errors.ContractViolation(r.json()["error"]["message"]), "sglang").body
        # a valid body the server cannot serve: the same shape
        r = await client.post("/generate", json={"input_ids": [1, 2], "stream": True})
        assert r.status_code == 400
        assert (
            r.json()
            == render_error(
                errors.BadRequest("areal-nb engine-server does not stream; send stream=false"), "sglang"
            ).body
        )


def test_the_engine_server_checks_sampling_at_the_door():
    """A batch with one item out of range is a 400 before any item reaches the engine, with the
    message of the one rule (`GenerationConfig.check`); the engine never sees it."""
    asyncio.run(_the_engine_server_checks_sampling_at_the_door())


async def _the_engine_server_checks_sampling_at_the_door():
    from areal_nb.api import ModelResponse
    from areal_nb.engine.server_app import create_engine_app
    from areal_nb.testing.served_stub import ServedStub

    class Counting(ServedStub):
        calls = 0

        async def agenerate(self, request):
            Counting.calls += 1
            return ModelResponse(
                input_tokens=list(request.input_ids),
                output_tokens=[2],
                output_logprobs=[0.0],
                output_versions=[0],
                stop_reason="stop",
            )

    app = create_engine_app(Counting())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine") as client:
        for bad, message in (
            ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
            ({"temperature": -1.0}, "temperature must be 0 (greedy) or in [0.01, 100], got -1.0"),
            ({"temperature": 1e-4}, "temperature must be 0 (greedy) or in [0.01, 100], got 0.0001"),
        ):
            r = await client.post(
                "/generate",
                json={
                    "input_ids": [[1, 2], [3, 4]],
                    "sampling_params": [{"max_new_tokens": 4}, {"max_new_tokens": 4, **bad}],
                },
            )
            assert r.status_code == 400, r.text
            assert r.json() == {"error": {"message": message, "code": 400}}
        assert Counting.calls == 0
        ok = await client.post(
            "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}}
        )
        assert ok.status_code == 200, ok.text
        assert Counting.calls == 1


# ------------------------------------------------------------------ the families

FAMILIES = {
    errors.RequestError: (),
    errors.EngineError: (),
    errors.DataError: (),
    errors.UsageError: (),
    errors.EpisodeError: (),
    errors.RewardError: (RuntimeError,),
    errors.SessionError: (),
}


def test_the_families_are_the_direct_children_of_the_base():
    assert set(ArealError.__subclasses__()) == set(FAMILIES)
    for family, builtins in FAMILIES.items():
        assert family.__bases__ == (ArealError, *builtins)


def test_every_exception_class_lies_under_exactly_one_family():
    for name, cls in _exception_classes().items():
        if issubclass(cls, Warning) or cls is ArealError or cls in FAMILIES:
            continue
        under = [family for family in FAMILIES if issubclass(cls, family)]
        assert len(under) == 1, f"{name} is under {under}"


def test_the_classes_moved_into_families_kept_their_status_and_builtins():
    assert issubclass(errors.CheckpointError, errors.DataError) and issubclass(
        errors.CheckpointError, ValueError
    )
    assert issubclass(errors.ConfigError, errors.UsageError)
    assert issubclass(errors.RewardValueError, errors.RewardError) and issubclass(
        errors.RewardValueError, TypeError
    )
    assert issubclass(errors.LeaderFailed, errors.SessionError) and issubclass(
        errors.LeaderFailed, RuntimeError
    )
    assert issubclass(errors.ProxyRequestError, errors.RequestError)
    assert issubclass(errors.EpisodeRejected, errors.EpisodeError)
    assert (errors.ContextLengthExceeded(10, 8).status, errors.ContextLengthExceeded(10, 8).code) == (
        400,
        "context_length_exceeded",
    )
    assert errors.GenerationAborted("x").status == 503
    for cls, builtin in (
        (errors.InvalidArgumentError, ValueError),
        (errors.ArgumentTypeError, TypeError),
        (errors.CallOrderError, RuntimeError),
        (errors.ProxyStartError, RuntimeError),
    ):
        assert issubclass(cls, builtin)
        with pytest.raises(builtin, match="same words"):
            raise cls("the same words")


# ------------------------------------------------------------------ the packages raise typed errors


def test_argument_checks_raise_typed_errors_that_are_still_their_builtins():
    """A bad argument in each package raises the typed class, which `except ValueError` (or the
    builtin the check raised before) still catches, with the same words."""
    from areal_nb.engine.admission import AdmissionWindow
    from areal_nb.proxy import ProxySettings
    from areal_nb.proxy.client import OpenAIProxyClient
    from areal_nb.reward.functions import resolve_reward
    from areal_nb.rollout.switch_interval import SwitchIntervalLease

    with pytest.raises(errors.InvalidArgumentError, match="admin_api_key must be a non-empty string"):
        ProxySettings(admin_api_key="")
    with pytest.raises(ValueError, match="no session"):
        _ = OpenAIProxyClient("http://127.0.0.1:1", admin_api_key="k", task_id="t").session_id
    with pytest.raises(errors.NotStartedError):
        _ = OpenAIProxyClient("http://127.0.0.1:1", admin_api_key="k", task_id="t").session_id
    with pytest.raises(errors.InvalidArgumentError, match="switch interval must be a positive"):
        SwitchIntervalLease(-1.0)
    with pytest.raises(errors.ArgumentTypeError, match="a reward must be a callable"):
        resolve_reward(3)
    with pytest.raises(TypeError, match="a reward must be a callable"):
        resolve_reward(3)
    with pytest.raises(errors.InvalidArgumentError, match="must be >= 0"):
        AdmissionWindow(-1.0, 0.0, lambda: False)


def test_the_capture_layer_raises_typed_errors_that_are_still_their_builtins():
    """The interaction cache, the interaction record, its wire form and the row stacker raise
    typed classes that the builtin they raised before still catches."""
    import torch

    from areal_nb.capture import InteractionCache, InteractionWithTokenLogpReward
    from areal_nb.capture.tensors import concat_padded_tensors
    from areal_nb.capture.wire import interaction_from_wire

    cache = InteractionCache()
    for cls, builtin, call, words in (
        (errors.CallOrderError, RuntimeError, lambda: cache.set_last_reward(1.0), "No completed interaction"),
        (
            errors.InvalidArgumentError,
            ValueError,
            lambda: cache.apply_reward_discount(1.0, "x"),
            "discount mode",
        ),  # type: ignore[arg-type]
        (errors.ArgumentTypeError, TypeError, lambda: cache.apply_reward_discount("1"), "turn_discount"),  # type: ignore[arg-type]
        (errors.ArgumentTypeError, TypeError, lambda: cache.insert("a", object()), "InteractionCache values"),  # type: ignore[arg-type]
        (
            errors.ArgumentTypeError,
            TypeError,
            lambda: InteractionWithTokenLogpReward(reward="1"),
            "int or float",
        ),
        (
            errors.InvalidArgumentError,
            ValueError,
            lambda: InteractionWithTokenLogpReward(reward=float("nan")),
            "finite",
        ),
        (
            errors.IncompleteInteractionError,
            ValueError,
            InteractionWithTokenLogpReward().token_row,
            "no model_response",
        ),
        (
            errors.ExportError,
            ValueError,
            lambda: interaction_from_wire(InteractionWithTokenLogpReward, {}, {}),
            "wire version",
        ),
        (
            errors.TrainBatchError,
            ValueError,
            lambda: concat_padded_tensors([{"a": torch.ones(1, 2)}, {"b": torch.ones(1, 2)}]),
            "has keys",
        ),
    ):
        with pytest.raises(cls, match=words) as raised:
            call()
        assert isinstance(raised.value, builtin)
    cache.apply_reward_discount(1.0)
    with pytest.raises(errors.CallOrderError, match="only be called once"):
        cache.apply_reward_discount(1.0)


# Representative arguments for the classes whose constructor is not `cls(message)`.
_PICKLE_ARGUMENTS: dict[str, tuple[tuple[object, ...], dict[str, object]]] = {
    "BodyOverLimit": ((2048,), {}),
    "BodyTimedOut": ((512,), {}),
    "BodyError": ((408, "body not complete in time"), {}),
    "BodyTooLarge": ((1024,), {}),
    "ContextLengthExceeded": ((5000, 4096), {"at_least": True, "detail": "counted before tokenizing"}),
    "EpisodeRejected": (("timeout", "the agent ran past its deadline"), {}),
    "HTTPError": (("teapot",), {"status": 418, "code": "teapot"}),
    "ProxyError": ((409, "session already finished", "conflict"), {"retry_after": 3}),
    "ProxyRequestError": (("/rl/end_session", 503, "server busy"), {}),
}


def _exported_exception_classes() -> list[type[BaseException]]:
    return [
        value
        for name in errors.__all__
        if inspect.isclass(value := getattr(errors, name)) and issubclass(value, BaseException)
    ]


@pytest.mark.parametrize("cls", _exported_exception_classes(), ids=lambda cls: cls.__name__)
def test_every_error_survives_pickling(cls):
    # errors cross process boundaries: an agent's in a process-pool worker, a rank's in a job
    args, kwargs = _PICKLE_ARGUMENTS.get(cls.__name__, (("something failed",), {}))
    error = cls(*args, **kwargs)
    error.add_note("a note added while it propagated")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error) and copy.args == error.args
    assert vars(copy) == vars(error)
    for attribute in ("status", "code", "retry_after", "message"):
        if hasattr(error, attribute):
            assert getattr(copy, attribute) == getattr(error, attribute)
    if isinstance(error, errors.HTTPError):
        for dialect in errors.DIALECTS:
            assert render_error(copy, dialect) == render_error(error, dialect)


def test_a_missing_package_error_keeps_its_import_error_fields_through_pickling():
    error = errors.MissingPackageError("pip install areal-nb[server]", name="uvicorn")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.name) == (errors.MissingPackageError, str(error), "uvicorn")
