"""`ArealOpenAI`: an `openai.AsyncOpenAI` whose calls go straight to an engine (direct mode).

Legacy mode, kept for AReaL's multi-turn math example: the recommended way is the proxy,
which runs the same completion logic (`chat.create_chat_completion`) behind HTTP.
"""

from __future__ import annotations

from functools import cache, cached_property
from typing import Any, Self

import httpx
import openai

from areal_nb.api import ChatTemplateType, DiscountMode, ExportStyle, InferenceEngine
from areal_nb.errors import CallOrderError

from .cache import InteractionCache
from .chat import chat_completion_stream_chunks, create_chat_completion
from .interaction import InteractionWithTokenLogpReward
from .response_stream import response_stream_events
from .responses import create_response
from .settings import CompletionSettings


def _given(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Drop the SDK's NOT_GIVEN / omit placeholders (they mean "not set")."""
    return {k: v for k, v in kwargs.items() if not isinstance(v, openai.NotGiven | openai.Omit)}


def _refuse(request: httpx.Request) -> httpx.Response:
    raise CallOrderError(
        f"ArealOpenAI sends no HTTP requests (it calls its engine directly); "
        f"{request.method} {request.url} is not supported"
    )


@cache
def _offline_http_client() -> httpx.AsyncClient:
    """One shared HTTP client for every `ArealOpenAI`, which never sends a request.

    Without it the SDK builds a default client per instance, and that loads the CA bundle into
    a new SSL context each time (measured: ~20 ms, 2.6 s of a 4.2 s rollout of 128 episodes).
    `trust_env=False`: environment proxies would build SSL contexts too.
    """
    return httpx.AsyncClient(transport=httpx.MockTransport(_refuse), trust_env=False)


class ChunkStream:
    """Async iterator of stream chunks or events that also works as `async with` (like AsyncStream)."""

    def __init__(self, chunks: list[Any]) -> None:
        self._chunks = list(chunks)
        self._pos = 0

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> Any:
        if self._pos >= len(self._chunks):
            raise StopAsyncIteration
        self._pos += 1
        return self._chunks[self._pos - 1]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._pos = len(self._chunks)


class _Completions:
    def __init__(self, client: ArealOpenAI) -> None:
        self._client = client

    async def create(
        self,
        *,
        messages: Any,
        stream: bool = False,
        areal_cache: InteractionCache | None = None,
        **kwargs: Any,
    ) -> Any:
        """`chat.completions.create`; with `stream=True` an async iterator of chunks.

        The interaction is recorded before the stream is returned.
        """
        c = self._client
        completion = await create_chat_completion(
            engine=c.engine,
            tokenizer=c.tokenizer,
            settings=c.settings,
            cache=areal_cache if areal_cache is not None else c.cache,
            messages=messages,
            **_given(kwargs),
        )
        if stream is True:
            return ChunkStream(chat_completion_stream_chunks(completion))
        return completion


class _Chat:
    def __init__(self, client: ArealOpenAI) -> None:
        self.completions = _Completions(client)


class _Responses:
    def __init__(self, client: ArealOpenAI) -> None:
        self._client = client

    async def create(self, *, areal_cache: InteractionCache | None = None, **kwargs: Any) -> Any:
        """`responses.create`; with `stream=True` an async iterator of Responses stream events.

        The interaction is recorded before the stream is returned."""
        c = self._client
        kwargs = _given(kwargs)
        stream = kwargs.pop("stream", None)
        response = await create_response(
            engine=c.engine,
            tokenizer=c.tokenizer,
            settings=c.settings,
            cache=areal_cache if areal_cache is not None else c.cache,
            **kwargs,
        )
        if stream is True:
            return ChunkStream(response_stream_events(response))
        return response


class ArealOpenAI(openai.AsyncOpenAI):
    """OpenAI client bound to an engine and tokenizer; records every call with its tokens.

    `chat.completions.create` and `responses.create` behave like the OpenAI API; rewards are
    set with `set_reward(id, r)` / `set_last_reward(r)` (the most recently *completed* call),
    propagated with `apply_reward_discount` and exported with `export_interactions`.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        tool_call_parser: str = "qwen",
        reasoning_parser: str = "qwen3",
        engine_max_tokens: int | None = None,
        chat_template_type: ChatTemplateType = "hf",
        default_max_new_tokens: int | None = None,
        cache: InteractionCache | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("api_key", "none")
        kwargs.setdefault("base_url", "http://areal-nb.invalid/v1")  # never contacted
        if kwargs.get("http_client") is None:
            kwargs["http_client"] = _offline_http_client()
        super().__init__(**kwargs)
        self.engine = engine
        self.tokenizer = tokenizer
        self.settings = CompletionSettings(
            chat_template_type=chat_template_type,
            engine_max_tokens=engine_max_tokens,
            tool_call_parser=tool_call_parser,
            reasoning_parser=reasoning_parser,
            default_max_new_tokens=default_max_new_tokens,
            refuse_aborted=False,  # AReaL's client returns an aborted generation whole
        )
        self.cache = cache if cache is not None else InteractionCache()

    @cached_property
    def chat(self) -> _Chat:  # type: ignore[override]
        return _Chat(self)

    @cached_property
    def responses(self) -> _Responses:  # type: ignore[override]
        return _Responses(self)

    @property
    def chat_template_type(self) -> str:
        return self.settings.chat_template_type

    @chat_template_type.setter
    def chat_template_type(self, value: str) -> None:
        self.settings = CompletionSettings(**{**self.settings.__dict__, "chat_template_type": value})

    def get_interaction(self, interaction_id: str) -> InteractionWithTokenLogpReward | None:
        return self.cache.get(interaction_id)

    def set_reward(self, interaction_id: str, reward: float) -> None:
        self.cache.set_reward(interaction_id, reward)

    def set_last_reward(self, reward: float) -> str:
        """Reward the most recently *completed* call (not the most recently started one)."""
        return self.cache.set_last_reward(reward)

    def apply_reward_discount(
        self, turn_discount: float = 1.0, mode: DiscountMode = "tree"
    ) -> dict[str, InteractionWithTokenLogpReward]:
        return self.cache.apply_reward_discount(turn_discount, mode=mode)

    def export_interactions(
        self, style: ExportStyle = "individual", reward_discount: float | None = None
    ) -> dict[str, InteractionWithTokenLogpReward]:
        return self.cache.export_interactions(style, reward_discount=reward_discount)
