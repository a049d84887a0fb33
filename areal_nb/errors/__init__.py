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

One module per family (`families`: `ArealError` and the seven families; `http` and `request`:
`RequestError`'s kinds; `engine`, `data`, `usage`, `episode`, `reward`, `session`;
`areal_warnings`; `render`: `render_error`). Import them from here: every class is
`areal_nb.errors.<Name>` in tracebacks and pickles, wherever it is defined. The package imports
nothing of areal_nb outside itself: every layer may raise these.
"""

from __future__ import annotations

from .areal_warnings import (
    ArealWarning,
    ConversationLinkWarning,
    IncompleteInteractionWarning,
    MissingRewardWarning,
    NoLearningSignalWarning,
)
from .data import (
    CheckpointError,
    DatasetError,
    DatasetUnavailableError,
    ExportError,
    IncompleteInteractionError,
    TrainBatchError,
)
from .engine import (
    BatchShapeError,
    ConcatAlignmentError,
    EngineClosedError,
    EngineServerError,
    LoraError,
    ModelFileError,
    ServerDownError,
    ServerLaunchError,
    WeightUpdateError,
)
from .episode import (
    EnvironmentServerError,
    EpisodeRejected,
    FirstEpisodeError,
    GroupMismatchError,
    NoAcceptedEpisodesError,
    RolloutRejectedError,
    StalenessLimitError,
    TaskAbandoned,
)
from .families import (
    ArealError,
    DataError,
    EngineError,
    EpisodeError,
    RequestError,
    RewardError,
    SessionError,
    UsageError,
)
from .http import (
    DIALECTS,
    AnthropicRequestError,
    BadRequest,
    BodyError,
    BodyTooLarge,
    CompletionRequestError,
    ContextLengthExceeded,
    ContractViolation,
    Dialect,
    EngineRefused,
    GenerationAborted,
    HTTPError,
    InvalidRequestError,
    MessageTypeError,
    ProxyError,
    UnknownAgentError,
)
from .render import ErrorReply, render_error
from .request import (
    RETRYABLE_STATUS,  # noqa: F401 (the proxy client's retry rule; not in __all__)
    BodyOverLimit,
    BodyTimedOut,
    ClientGone,
    ProxyRequestError,
    ProxyStartError,
)
from .reward import (
    JudgeError,
    RewardFunctionError,
    RewardTimeoutError,
    RewardValueError,
    RewardWorkerCrashedError,
)
from .session import LeaderFailed, ProcessGroupError, SessionBusyError, SessionClosedError
from .usage import (
    ArgumentTypeError,
    CallOrderError,
    ConfigError,
    InvalidArgumentError,
    MissingPackageError,
    NotSerializableError,
    NotStartedError,
    TrainMemoryError,
)

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

# Each class keeps the name it has always had, `areal_nb.errors.<Name>`: the one tracebacks print,
# pickles store (errors sent between processes: agents in workers, the ranks of a job) and the
# docs link, whichever module of the package defines it.
for _value in list(globals().values()):
    if isinstance(_value, type) and issubclass(_value, BaseException):
        _value.__module__ = __name__
del _value
