"""Every exception areal_nb raises on purpose, under one base; its warnings; how an HTTP error is answered.

Catch `ArealError` for anything areal_nb raised on purpose; anything else is a bug (the servers
answer it with a 500 and a logged traceback). Each class is also importable from the module that
raises it (`areal_nb.config.ConfigError`, `areal_nb.api.InvalidRequestError`, ...), and each keeps
the built-in base it always had, so `except ValueError` still catches a `ConfigError`.

Every class lies under one of seven families, the direct children of `ArealError`: `RequestError`
(HTTP, either side), `EngineError`, `DataError` (datasets, exports, checkpoints), `UsageError`
(configuration, arguments, call order), `EpisodeError` (agents, episodes, rollout), `RewardError`
and `SessionError`; catch a family to catch all its kinds. A plain argument check raises
`InvalidArgumentError` (a ValueError), `ArgumentTypeError` (a TypeError) or `CallOrderError` (a
RuntimeError) unless a family has a more precise class.

The tree:

    ArealError
    ├── RequestError                    a request over HTTP failed (either side)
    │   ├── HTTPError                   an HTTP answer: `status`, `code`, `message`
    │   │   ├── InvalidRequestError (ValueError)      400 invalid_request: the request can never succeed as sent
    │   │   │   ├── CompletionRequestError            a chat completion / Responses request (capture layer)
    │   │   │   │   ├── MessageTypeError (TypeError)  messages of the wrong type
    │   │   │   │   └── ContextLengthExceeded         a conversation longer than the model's context
    │   │   │   ├── AnthropicRequestError             a Messages request that cannot be converted
    │   │   │   ├── BadRequest                        the engine-server's 400 (`{"error": {"message", "code"}}`)
    │   │   │   │   └── ContractViolation             a body the SGLang API schema rejects (same body)
    │   │   │   ├── EngineRefused                     an engine server's 400 as its client (SGLangEngine) raises it
    │   │   │   └── UnknownAgentError                 a call from an agent with no adapter of its own (`agents`)
    │   │   ├── ProxyError              any status a proxy route answers (401, 403, 404, 408, 409, 410, 429, 504...)
    │   │   ├── GenerationAborted       503 generation_aborted: the engine aborted the generation (retry)
    │   │   ├── BodyTooLarge            413 body_too_large
    │   │   └── BodyError               the engine-server's 413 / 408 for a body too large or too slow
    │   ├── ClientGone                  the client disconnected before its reply was ready
    │   ├── BodyOverLimit               a request body past its size limit (`declared`: its Content-Length)
    │   ├── BodyTimedOut                a request body not complete in time (`received`: bytes that came)
    │   ├── ProxyRequestError (RuntimeError)    a proxy endpoint answered an error (client side; `status`)
    │   └── ProxyStartError (RuntimeError)      the proxy server failed to start
    ├── EngineError                     an inference engine or its server cannot serve
    │   ├── ConcatAlignmentError (RuntimeError) the concat template did not extend the parent's tokens
    │   ├── EngineClosedError (RuntimeError)    the engine was closed before or while serving a request
    │   ├── EngineServerError (RuntimeError)    an engine server answered an error or broke the protocol
    │   │   └── ServerDownError                 the server that held a request is down
    │   ├── ServerLaunchError (RuntimeError)    an engine server exited or never became healthy at start-up
    │   ├── ModelFileError (ValueError)     a model file that cannot be loaded (missing, not GGUF, an unread architecture)
    │   ├── WeightUpdateError (ValueError)  new weights that do not fit the served model (nothing changes)
    │   ├── BatchShapeError (ValueError, RuntimeError)  the parts of an engine batch do not match
    │   └── LoraError (ValueError)          a LoRA adapter or flag the engine-server does not load or serve
    ├── DataError                       data that cannot be read or written
    │   ├── DatasetError (ValueError)       rows that cannot be trained or evaluated on
    │   ├── DatasetUnavailableError (RuntimeError)  a public dataset that could not be fetched
    │   ├── ExportError (ValueError)        a run that cannot be exported, or an export that cannot be read back
    │   ├── IncompleteInteractionError (ValueError)  a call's record lacks what is asked of it (no output yet)
    │   ├── TrainBatchError (ValueError)    a training batch with a missing key, disagreeing shapes, a bad mask
    │   └── CheckpointError (ValueError)    a checkpoint cannot be written there, or is damaged (names the file)
    ├── UsageError                      areal_nb configured or called wrongly (configuration)
    │   ├── ConfigError (ValueError)        a config file or override is invalid
    │   ├── InvalidArgumentError (ValueError)   an argument or setting outside what the function accepts
    │   ├── ArgumentTypeError (TypeError)   an argument of a type the function does not accept
    │   ├── CallOrderError (RuntimeError)   a method called before start, after stop, or twice
    │   ├── NotStartedError (ValueError)    a value asked for before its owner started (a session id)
    │   ├── MissingPackageError (ImportError)   an optional package a feature needs is not installed (says what to pip install)
    │   ├── NotSerializableError (TypeError)    user code that cannot be sent to a worker process
    │   └── TrainMemoryError (ValueError)   a training step estimated not to fit the device's free memory
    ├── EpisodeError                    an agent's episode or its rollout cannot go on (agent/episode)
    │   ├── EpisodeRejected                     an episode ran but must not be trained on
    │   ├── EnvironmentServerError (RuntimeError) an environment's server is down or broke its protocol
    │   ├── StalenessLimitError (RuntimeError)  more rollouts asked for than the staleness bound allows
    │   ├── FirstEpisodeError (RuntimeError)    the agent failed on the first training row
    │   ├── RolloutRejectedError (RuntimeError) every episode of several batches in a row was rejected
    │   ├── NoAcceptedEpisodesError (ValueError)   a batch to train on whose every episode was rejected
    │   ├── GroupMismatchError (ValueError, TypeError)  a group's episodes returned results that do not fit together
    │   └── TaskAbandoned                       awaited code ignored its cancellation and was left running
    ├── RewardError (RuntimeError)      a reward could not be computed
    │   ├── RewardTimeoutError
    │   ├── RewardWorkerCrashedError
    │   ├── RewardFunctionError
    │   ├── JudgeError                      an LLM judge timed out, failed or gave no readable score
    │   └── RewardValueError (TypeError)    a reward function returned something that is not a finite number
    └── SessionError                    a Session or a training rank cannot go on
        ├── SessionClosedError (RuntimeError)   a method of a closed Session was called
        ├── SessionBusyError (RuntimeError)     a Session method called while another thread's call runs
        ├── ProcessGroupError (RuntimeError)    the torchrun environment or process group does not match the job
        └── LeaderFailed (RuntimeError)         rank 0 failed (raised on the other ranks)

    ArealWarning (UserWarning)              what areal_nb warns about (`warnings.warn`), never raises
    ├── ConversationLinkWarning             a call that looks like a continuation is not linked as one
    ├── MissingRewardWarning                a reward discount found calls without a reward (they count 0.0)
    ├── IncompleteInteractionWarning        an export skipped calls that have not returned
    └── NoLearningSignalWarning             most groups of a training step had equal rewards (zero advantage)

`render_error(error, dialect)` is the one place an `HTTPError` becomes a reply body, for the
dialects the servers speak: `"openai"` (`{"error": {"message", "type", "param", "code"}}`),
`"completions"` and `"responses"` (the same shape; OpenAI's legacy text completions and the
Responses API word some errors their own way), `"anthropic"`
(`{"type": "error", "error": {"type", "message"}}`) and `"sglang"` (the engine-server's native
API: `{"error": {"message", "code"}}`, SGLang's `ErrorBody`). An error may word itself per
dialect (`message_in`, `param_in`): agent harnesses recognise a context overflow by the words
of the API they speak (`ContextLengthExceeded`).

This module imports nothing of areal_nb: every layer may raise these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Dialect = Literal["openai", "completions", "responses", "anthropic", "sglang"]
DIALECTS: tuple[Dialect, ...] = ("openai", "completions", "responses", "anthropic", "sglang")


class ArealError(Exception):
    """The base of every exception areal_nb raises on purpose."""


# ---------------------------------------------------------------------------------- the families
# Each class below derives from exactly one of these (catch a family to catch all its kinds).
# They add no builtin base but RewardError's (RuntimeError): a family spans several builtins.


class RequestError(ArealError):
    """A request over HTTP failed: an answer a server gives, a body or client that broke off, a
    proxy endpoint that answered an error to its client."""


class EngineError(ArealError):
    """An inference engine or its server cannot serve: closed, down, failed to start, or refused a
    model file or adapter."""


class DataError(ArealError):
    """Data that cannot be read or written: dataset rows, an export, a checkpoint."""


class UsageError(ArealError):
    """areal_nb was configured or called wrongly: a config key, an argument, a missing package, a
    method called in the wrong state. The message says what to change."""


class EpisodeError(ArealError):
    """An agent's episode or the rollout that runs it cannot go on, or must not be trained on."""


class RewardError(ArealError, RuntimeError):
    """A reward could not be computed; the episode that needed it should be rejected."""


class SessionError(ArealError):
    """A Session or a training rank cannot go on: closed, busy, or its leader failed."""


# ---------------------------------------------------------------------------------- configuration and use


class InvalidArgumentError(UsageError, ValueError):
    """An argument or setting outside what the function accepts; the message names it."""


class ArgumentTypeError(UsageError, TypeError):
    """An argument of a type the function does not accept; the message names it."""


class CallOrderError(UsageError, RuntimeError):
    """A method called in a state that does not allow it: before start, after stop, twice."""


class NotStartedError(UsageError, ValueError):
    """A value asked for that exists only once its owner started (a session id before `async with`)."""


# ---------------------------------------------------------------------------------- HTTP answers


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


# ---------------------------------------------------------------------------------- the transport


class ClientGone(RequestError):
    """The client disconnected before the reply was ready; its work was cancelled."""


class BodyOverLimit(RequestError):
    """The body is larger than the limit; `declared`: its Content-Length, when that said so."""

    def __init__(self, declared: int | None = None) -> None:
        super().__init__(declared)
        self.declared = declared


class BodyTimedOut(RequestError):
    """The body was not complete in time; `received`: the bytes that had arrived."""

    def __init__(self, received: int) -> None:
        super().__init__(received)
        self.received = received


# ---------------------------------------------------------------------------------- user input


class ConfigError(UsageError, ValueError):
    """A config file or override is invalid; the message names the key."""


class DatasetError(DataError, ValueError):
    """A dataset that cannot be trained or evaluated on; the message names the row and why."""


class TrainMemoryError(UsageError, ValueError):
    """A training step estimated not to fit the device's free memory; the message names the setting to change."""


class DatasetUnavailableError(DataError, RuntimeError):
    """A public dataset could not be fetched (offline, no access); the message says to pass a local file."""


class ExportError(DataError, ValueError):
    """The run cannot be exported (or an export, an interaction's wire form, cannot be read back);
    the message names what and why."""


class IncompleteInteractionError(DataError, ValueError):
    """A call's record lacks what is asked of it: no model response, no output yet (a call that
    has not returned, or a parent asked for before its child's prompt can be built)."""


class ModelFileError(EngineError, ValueError):
    """`model.path` names a file that cannot be loaded: missing, not GGUF, or of an architecture
    transformers does not read from GGUF; the message names the file."""


class MissingPackageError(UsageError, ImportError):
    """An optional package a feature needs is not installed; the message says what to pip install."""


class NotSerializableError(UsageError, TypeError):
    """User code cannot be sent to a worker process."""


# ---------------------------------------------------------------------------------- capture, engines, proxy client


class ConcatAlignmentError(EngineError, RuntimeError):
    """The full-conversation template could not be aligned with the parent's tokens."""


class EngineClosedError(EngineError, RuntimeError):
    """The engine was closed before (or while) serving the request."""


class EngineServerError(EngineError, RuntimeError):
    """An engine server answered with an error, broke the protocol, or the engine was closed."""


class ServerDownError(EngineServerError):
    """The server that held the request is down (process died, connection lost)."""


class ServerLaunchError(EngineError, RuntimeError):
    """The server process exited (or never became healthy) during start-up."""


class WeightUpdateError(EngineError, ValueError):
    """New weights that do not fit the served model (unknown names, wrong shapes, no files, nowhere
    to write them); the engine keeps the weights it had."""


class BatchShapeError(EngineError, ValueError, RuntimeError):
    """The parts of an engine batch do not match (prompts and prefixes, rows and logits, decode
    tokens and rows): a caller's bug; a ValueError, and a RuntimeError too since decode's was one."""


class LoraError(EngineError, ValueError):
    """A LoRA adapter (or launch flag) the engine-server does not load or serve; its message is
    SGLang's answer to the client."""


# Status codes that mean "try again later" rather than "your request is wrong".
RETRYABLE_STATUS = frozenset({408, 429, 502, 503, 504})


class ProxyStartError(RequestError, RuntimeError):
    """The proxy server failed to start; the message holds the error it failed with."""


class ProxyRequestError(RequestError, RuntimeError):
    """A proxy endpoint answered with an error status (or could not be reached)."""

    def __init__(self, endpoint: str, status: int | None, detail: str) -> None:
        self.endpoint = endpoint
        self.status = status
        self.detail = detail
        where = f"HTTP {status}" if status is not None else "no response"
        super().__init__(f"proxy {endpoint} failed ({where}): {detail}")

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status in RETRYABLE_STATUS


# ---------------------------------------------------------------------------------- rollout, rewards, the session


class EpisodeRejected(EpisodeError):
    """The episode ran but its trajectory must not be trained on; `kind` names the reason's kind."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class RewardTimeoutError(RewardError):
    """The reward function ran past its timeout."""


class RewardWorkerCrashedError(RewardError):
    """The worker process computing the reward died."""


class RewardFunctionError(RewardError):
    """The reward function raised."""


class JudgeError(RewardError):
    """An LLM judge did not answer in time, failed, or answered without a readable score (quoted)."""


class EnvironmentServerError(EpisodeError, RuntimeError):
    """An environment's server cannot be started or reached, dropped the session or refused a message.

    Raised inside an episode, it rejects that episode with this message; the run goes on."""


class RewardValueError(RewardError, TypeError):
    """A reward function returned something that is not a finite number."""


class StalenessLimitError(EpisodeError, RuntimeError):
    """More rollouts were asked for than the staleness bound allows before the next training step."""


class FirstEpisodeError(EpisodeError, RuntimeError):
    """The agent failed on the first training row; the message holds the row and its traceback."""


class RolloutRejectedError(EpisodeError, RuntimeError):
    """Every episode of `MAX_EMPTY_BATCHES` batches in a row was rejected; the message lists why and where."""


class NoAcceptedEpisodesError(EpisodeError, ValueError):
    """A batch to train on whose every episode was rejected; the message lists why."""


class GroupMismatchError(EpisodeError, ValueError, TypeError):
    """The episodes of one group returned results that cannot be put together (an interaction id in
    two of them, different tensor keys, tensors mixed with interactions); a ValueError, and a
    TypeError too since a mix of kinds was one."""


class TaskAbandoned(EpisodeError):
    """The awaited code ignored its cancellation for the grace period; it was left running."""


class TrainBatchError(DataError, ValueError):
    """A training batch that cannot be trained on: a missing key, shapes that disagree, a mask not
    right-padded, fewer rows than minibatches; the message names the key."""


class CheckpointError(DataError, ValueError):
    """A checkpoint cannot be written where asked, or cannot be loaded: the message names the
    file and what is wrong with it."""


class SessionClosedError(SessionError, RuntimeError):
    """Every method of a closed Session raises this (`close()` itself excepted)."""


class SessionBusyError(SessionError, RuntimeError):
    """A Session method was called from one thread while another thread's call was running."""


class ProcessGroupError(SessionError, RuntimeError):
    """The torchrun environment or process group does not match the job (unset RANK..., another
    world size); the message says how to start it."""


class LeaderFailed(SessionError, RuntimeError):
    """Rank 0 failed; raised on the other ranks with rank 0's error message."""


# ---------------------------------------------------------------------------------- warnings


class ArealWarning(UserWarning):
    """The base of every warning areal_nb issues."""


class ConversationLinkWarning(ArealWarning):
    """A call looks like a continuation but is not linked as one: an edited assistant message, or
    (concat mode) tools or template variables that differ from the parent's."""


class MissingRewardWarning(ArealWarning):
    """A reward discount found calls whose reward was never set (they count as 0.0)."""


class IncompleteInteractionWarning(ArealWarning):
    """An export skipped calls that have not returned."""


class NoLearningSignalWarning(ArealWarning):
    """Most groups of a training step had equal rewards in every episode: their advantages are 0
    and they teach nothing. The message says what to try."""


# ---------------------------------------------------------------------------------- rendering

_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
    504: "timeout_error",
}
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    504: "timeout_error",
}
# The OpenAI and Anthropic SDKs retry 408/409/429/5xx unless told otherwise; these answers will
# not change on retry.
_NO_RETRY = frozenset({400, 401, 403, 404, 409, 410, 413, 422})


@dataclass(frozen=True)
class ErrorReply:
    """What a server sends for an error: status, JSON body and extra headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


def render_error(error: HTTPError, dialect: Dialect) -> ErrorReply:
    """`error` as `dialect`'s client expects it (see the module docstring for the shapes)."""
    if dialect not in DIALECTS:
        raise InvalidArgumentError(f"unknown error dialect {dialect!r}; expected one of {DIALECTS}")
    status, message = error.status, error.message_in(dialect)
    if dialect == "sglang":
        # SGLang's API types' ErrorBody, which its clients decode (SGLang's own /generate sends a
        # schema violation as a bare {"error": "..."}; SGLangEngine reads both)
        return ErrorReply(status, {"error": {"message": message, "code": status}})
    headers = {"x-should-retry": "false"} if status in _NO_RETRY else {}
    if error.retry_after is not None:  # the OpenAI and Anthropic SDKs wait this long before retrying
        headers["retry-after"] = str(error.retry_after)
    if dialect == "anthropic":
        body = {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPES.get(status, "invalid_request_error"), "message": message},
        }
    else:  # "openai", "completions", "responses"
        body = {
            "error": {
                "message": message,
                "type": _OPENAI_TYPES.get(status, "invalid_request_error"),
                "param": error.param_in(dialect),
                "code": error.code,
            }
        }
    return ErrorReply(status, body, headers)


__all__ = [
    "ArgumentTypeError",
    "CallOrderError",
    "DataError",
    "EngineError",
    "EpisodeError",
    "InvalidArgumentError",
    "DatasetUnavailableError",
    "TrainBatchError",
    "ProcessGroupError",
    "WeightUpdateError",
    "BatchShapeError",
    "NoAcceptedEpisodesError",
    "GroupMismatchError",
    "NotStartedError",
    "RequestError",
    "SessionError",
    "UsageError",
    "SessionBusyError",
    "SessionClosedError",
    "CheckpointError",
    "TaskAbandoned",
    "DIALECTS",
    "AnthropicRequestError",
    "ArealError",
    "ArealWarning",
    "NoLearningSignalWarning",
    "BadRequest",
    "BodyError",
    "BodyOverLimit",
    "BodyTimedOut",
    "BodyTooLarge",
    "ClientGone",
    "CompletionRequestError",
    "ConcatAlignmentError",
    "ConfigError",
    "ContextLengthExceeded",
    "ContractViolation",
    "UnknownAgentError",
    "ConversationLinkWarning",
    "DatasetError",
    "Dialect",
    "EngineClosedError",
    "EngineRefused",
    "EngineServerError",
    "EpisodeRejected",
    "ErrorReply",
    "EnvironmentServerError",
    "ExportError",
    "FirstEpisodeError",
    "GenerationAborted",
    "HTTPError",
    "IncompleteInteractionError",
    "IncompleteInteractionWarning",
    "InvalidRequestError",
    "JudgeError",
    "LeaderFailed",
    "LoraError",
    "MessageTypeError",
    "MissingPackageError",
    "MissingRewardWarning",
    "ModelFileError",
    "NotSerializableError",
    "ProxyError",
    "ProxyRequestError",
    "ProxyStartError",
    "RewardError",
    "RewardFunctionError",
    "RewardTimeoutError",
    "RewardValueError",
    "RewardWorkerCrashedError",
    "RolloutRejectedError",
    "ServerDownError",
    "ServerLaunchError",
    "StalenessLimitError",
    "TrainMemoryError",
    "render_error",
]
