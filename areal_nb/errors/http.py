"""`RequestError`'s HTTP answers: `HTTPError` (`status`, `code`, `message`, worded per dialect) and
its kinds, each the answer a server gives for one kind of failure.
"""

from __future__ import annotations

from typing import Any, Literal

from .families import RequestError

Dialect = Literal["openai", "completions", "responses", "anthropic", "sglang"]
DIALECTS: tuple[Dialect, ...] = ("openai", "completions", "responses", "anthropic", "sglang")


class HTTPError(RequestError):
    """An error a server answers with `status`; `code` is a short machine-readable tag.

    Subclasses set the class defaults; an instance may override them (`ProxyError(409, ...)`)."""

    status: int = 500
    code: str | None = None
    retry_after: int | None = None  # seconds; sent as `Retry-After` where a later retry can succeed

    def __init__(self, message: str = "", *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self) or type(self).__name__

    def message_in(self, dialect: Dialect) -> str:
        """The message as a client of `dialect` reads it (the same in every dialect by default)."""
        return self.message

    def param_in(self, dialect: Dialect) -> str | None:
        """The request field at fault, for OpenAI's `param` (None: none in particular)."""
        return None


class InvalidRequestError(HTTPError, ValueError):
    """A request that can never succeed as sent (a client error: HTTP 400).

    Raised for input problems only; anything else an engine or the capture code raises is
    our own fault (HTTP 500 with a logged traceback).
    """

    status = 400
    code = "invalid_request"


class CompletionRequestError(InvalidRequestError):
    """An invalid chat completion or Responses request: the proxy answers 400 and `str(error)`."""


class MessageTypeError(CompletionRequestError, TypeError):
    """Messages of the wrong type (a `TypeError` that is also a `CompletionRequestError`)."""


class ContextLengthExceeded(CompletionRequestError):
    """A conversation longer than the model's context: 400 `context_length_exceeded`, worded in
    each API's own overflow words (OpenAI and vLLM's chat and text completions, the Responses API,
    Anthropic), which
    agent harnesses (verifiers, LangChain, LiteLLM, the Agents SDK) match to end an episode with
    its conversation instead of failing it.

    `tokens`: the prompt's tokens, or with `at_least` a lower bound on them found before
    tokenizing; `context`: the model's context (prompt + output) in tokens; `detail`: how the
    proxy found it. Every door that checks a prompt's size raises this one error."""

    code = "context_length_exceeded"

    def __init__(self, tokens: int, context: int, *, at_least: bool = False, detail: str = "") -> None:
        self.tokens, self.context, self.at_least, self.detail = tokens, context, at_least, detail
        super().__init__(self.message_in("openai"))

    def message_in(self, dialect: Dialect) -> str:
        n = f"{'at least ' if self.at_least else ''}{self.tokens}"
        if dialect == "anthropic":  # Anthropic's words; the most prompt tokens leave one for output
            head = f"prompt is too long: {self.tokens} tokens > {self.context - 1} maximum"
            return f"{head} ({self.detail})" if self.detail else head
        if dialect == "completions":  # OpenAI's legacy completions: the prompt plus one output token
            head = (
                f"This model's maximum context length is {self.context} tokens, however you requested "
                f"{'at least ' if self.at_least else ''}{self.tokens + 1} tokens ({n} in your prompt; "
                "1 for the completion). Please reduce your prompt; or completion length."
            )
            why = ""
        elif dialect == "responses":
            head = (
                "Your input exceeds the context window of this model. Please adjust your input and try again."
            )
            why = f"{n} tokens; the model's context length is {self.context} tokens"
        else:
            head = (
                f"This model's maximum context length is {self.context} tokens. However, your messages "
                f"resulted in {n} tokens. Please reduce the length of the messages."
            )
            why = ""
        # "prompt is too long" too: clients that read only the message (LangChain on openai 3) match it
        why = "; ".join(part for part in (why, self.detail) if part)
        return f"{head} (the prompt is too long{': ' + why if why else ''})"

    def param_in(self, dialect: Dialect) -> str | None:
        return {"responses": "input", "completions": "prompt"}.get(dialect, "messages")


class AnthropicRequestError(InvalidRequestError):
    """A Messages request that cannot be converted: the proxy answers 400."""


class BadRequest(InvalidRequestError):
    """The engine-server's client error: 400 with `{"error": {"message", "code"}}` (SGLang's ErrorBody)."""


class ContractViolation(BadRequest):
    """A body the SGLang API schema rejects (its api_contract check): a 400 like any BadRequest."""


class EngineRefused(InvalidRequestError):
    """An engine server (SGLang or `areal-nb engine-server`) answered a request with 400: the
    request can never succeed there, so the caller gets a 400 naming the server's reason, not
    a 500 (raised by `SGLangEngine`, the client side of `BadRequest`)."""


class UnknownAgentError(InvalidRequestError):
    """A call from an agent that has no engine of its own, where each agent trains its own adapter."""

    code = "unknown_agent"

    @classmethod
    def of(cls, agent: str | None, agents: Any) -> UnknownAgentError:
        """The error for a call of `agent` (None: the call named none) where only `agents` have one."""
        named = ", ".join(repr(a) for a in agents)
        said = "names no agent" if agent is None else f"comes from agent {agent!r}"
        return cls(
            f"this call {said}, but each agent trains its own adapter here and only {named} have one "
            "(the `agents` config): send the agent's name as the request's `model`"
        )


class ProxyError(HTTPError):
    """An HTTP error a proxy route answers, with a clear message and its status and code."""

    def __init__(
        self, status: int, message: str, code: str | None = None, *, retry_after: int | None = None
    ) -> None:
        super().__init__(message, status=status, code=code)
        self.retry_after = retry_after


class GenerationAborted(HTTPError):
    """The engine aborted a generation before it stopped on its own (a server that dropped it,
    an operator's abort): a server answers 503 with `Retry-After`, records nothing, and the
    agent's SDK retries it, instead of a cut reply that looks complete."""

    status = 503
    code = "generation_aborted"
    retry_after = 1


class BodyTooLarge(HTTPError):
    """A request body past the proxy's limit: 413."""

    status = 413
    code = "body_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"request body too large: the limit is {limit} bytes (see the proxy's 'Limits and errors')"
        )
        self.limit = limit

    @property
    def detail(self) -> str:  # what the starlette HTTPException it once was called its message
        return self.message


class BodyError(HTTPError):
    """A body that is too large (413) or did not arrive in time (408); the connection is closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, status=status)
