"""An LLM as the reward: a rubric, a judge model, a score in [0, 1].

    score = judge("1 if the reply states the correct sum, else 0", base_url="http://host/v1", model="m")
    ChatAgent(reward_fn=score)                    # a reward function like any other: score(row, reply)

    judge(rubric, engine="initial")                # the Session's own model, frozen at its first weights

Two ways to score:

- `mode="pointwise"`: one judge call per reply; the judge ends its answer with `SCORE: <x>`.
- `mode="group"` (RULER-style): the replies of one GRPO group are scored in one call, relative to
  each other (`[i]: <x>` per reply). Used as a reward function, each episode's call waits until
  `group_size` replies to the same row have arrived (or `group_wait` seconds after the first:
  a rejected member must not hold the others), and one judge call scores them all. Episodes
  that run alone (the Session's first-episode check, `evaluate()`) are scored alone after
  `group_wait`.

The judge is any OpenAI-compatible endpoint (`base_url`, `api_key`, `model`) or an inference
engine with its tokenizer (`engine=`, `tokenizer=`); `engine="initial"` asks the Session to bind a
frozen copy of the initial policy when it starts. Either way the judge's calls never go through the
training proxy, so they are never recorded or trained on. Results are cached per (rubric,
trajectory). A judge that does not answer within `timeout` seconds, or answers without a score
this module can read, raises `JudgeError` quoting its reply: the episode is rejected with that
message, never left hanging.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal

from areal_nb.api import GenerationConfig, InferenceEngine, ModelRequest
from areal_nb.errors import InvalidArgumentError, JudgeError

_JudgeMode = Literal["pointwise", "group"]
_CACHE_SIZE = 4096  # judged trajectories remembered per judge
_SESSION_ENGINE = "initial"  # engine="initial": the Session binds a frozen copy of its initial policy

POINTWISE_SYSTEM = (
    "You are a strict grader. Read the rubric, the task and the response, then grade the response "
    "against the rubric. End your answer with one line 'SCORE: <number from 0 to 1>'."
)
_GROUP_SYSTEM = (
    "You are a strict grader. Read the rubric, the task and the numbered responses, then score every "
    "response against the rubric, relative to the others: better responses get higher scores. End your "
    "answer with one line per response, '[<number>]: <score from 0 to 1>'."
)

_SCORE = re.compile(r"score\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*")
_GROUP_LINE = re.compile(r"^\s*\[?(\d+)\]?\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.MULTILINE)


def _task_text(row: Mapping[str, Any] | str) -> str:
    """What the judge is told the task was: the row's prompt, its chat messages, or the row as JSON."""
    if isinstance(row, str):
        return row
    for key in ("prompt", "question"):
        if isinstance(row.get(key), str):
            return row[key]
    messages = row.get("messages")
    if isinstance(messages, list):
        return "\n".join(
            f"{m.get('role', '?')}: {m.get('content', '')}" for m in messages if isinstance(m, Mapping)
        )
    return json.dumps(dict(row), sort_keys=True, default=str)


def _completion_text(completion: Any) -> str:
    """A reply as text: a string as is, a chat message list or a message dict as role-tagged lines."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        completion = [completion]
    if isinstance(completion, list):
        return "\n".join(
            f"{m.get('role', 'assistant')}: {m.get('content') or ''}"
            for m in completion
            if isinstance(m, Mapping)
        )
    return str(completion)


def _quote(reply: str, n: int = 400) -> str:
    return repr(reply if len(reply) <= n else reply[:n] + "…")


def parse_score(reply: str) -> float:
    """The score of a pointwise answer: its last 'SCORE: x', or the whole answer as one number."""
    found = _SCORE.findall(reply)
    if found:
        value = float(found[-1])
    elif (bare := _NUMBER.fullmatch(reply)) is not None:
        value = float(bare.group(1))
    else:
        raise JudgeError(f"the judge's answer has no 'SCORE: <number>': {_quote(reply)}")
    if not 0.0 <= value <= 1.0:
        raise JudgeError(f"the judge's score {value} is outside [0, 1]: {_quote(reply)}")
    return value


def parse_group_scores(reply: str, n: int) -> list[float]:
    """The scores of a group answer: one '[i]: x' line for each of the n responses (the last one counts)."""
    scores: dict[int, float] = {}
    for index, value in _GROUP_LINE.findall(reply):
        scores[int(index)] = float(value)
    missing = [i for i in range(1, n + 1) if i not in scores]
    if missing:
        raise JudgeError(f"the judge's answer has no score for response(s) {missing} of {n}: {_quote(reply)}")
    values = [scores[i] for i in range(1, n + 1)]
    if any(not 0.0 <= v <= 1.0 for v in values):
        raise JudgeError(f"the judge's scores {values} are not all in [0, 1]: {_quote(reply)}")
    return values


@dataclass
class _Gathering:
    """The replies to one row waiting for their group to be complete."""

    row: Mapping[str, Any]
    completions: list[str] = field(default_factory=list)
    futures: list[asyncio.Future] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


@dataclass(eq=False, repr=False)
class Judge:
    """A reward function `judge(row, completion) -> float` that asks an LLM. Build it with `judge(...)`."""

    rubric: str
    _: KW_ONLY
    mode: _JudgeMode = "pointwise"
    base_url: str | None = None
    api_key: str | None = None
    model: str = "default"
    engine: InferenceEngine | str | None = None
    tokenizer: Any = None
    timeout: float = 60.0
    max_tokens: int = 256
    group_size: int | None = None
    group_wait: float = 10.0
    parse: Callable[[str], float] | None = None  # None: `parse_score`
    calls: int = field(default=0, init=False)  # judge calls made (cache hits are not calls)
    _cache: OrderedDict[str, Any] = field(default_factory=OrderedDict, init=False)  # LRU, _CACHE_SIZE entries
    _open: dict[str, _Gathering] = field(default_factory=dict, init=False)
    _client: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        rubric, mode, engine, group_size = self.rubric, self.mode, self.engine, self.group_size
        if not isinstance(rubric, str) or not rubric.strip():
            raise InvalidArgumentError("a judge needs a rubric: what a good response is, in words")
        if mode not in ("pointwise", "group"):
            raise InvalidArgumentError(f"mode must be 'pointwise' or 'group', got {mode!r}")
        if (self.base_url is None) == (engine is None):
            raise InvalidArgumentError(
                "give the judge either base_url (an OpenAI-compatible endpoint) or engine "
                f"(an inference engine with its tokenizer, or {_SESSION_ENGINE!r} for the Session's own)"
            )
        if isinstance(engine, str) and engine != _SESSION_ENGINE:
            raise InvalidArgumentError(
                f"engine must be an inference engine or {_SESSION_ENGINE!r}, got {engine!r}"
            )
        if engine is not None and not isinstance(engine, str) and self.tokenizer is None:
            raise InvalidArgumentError("a judge on an engine needs the engine's tokenizer (tokenizer=...)")
        if mode == "group" and (group_size is None or group_size < 1):
            raise InvalidArgumentError(
                "mode='group' needs group_size (the Session's rollout.group_size) >= 1"
            )
        if self.timeout <= 0:
            raise InvalidArgumentError(f"timeout must be positive, got {self.timeout}")

    # ---------------------------------------------------------------- binding
    @property
    def needs_session_engine(self) -> bool:
        return self.engine == _SESSION_ENGINE

    def bind_engine(self, engine: InferenceEngine, tokenizer: Any) -> None:
        """Judge with `engine` from now on (the Session binds its frozen initial policy here)."""
        self.engine, self.tokenizer = engine, tokenizer

    # ---------------------------------------------------------------- the judge call
    async def _ask(self, messages: list[dict[str, str]]) -> str:
        """One judge call, bounded by `timeout`: the reply's text."""
        if self.needs_session_engine:
            raise JudgeError(
                f"this judge asks for the Session's engine ({_SESSION_ENGINE!r}) but was not bound to "
                "one: use it inside a Session, or give it base_url or engine="
            )
        self.calls += 1
        try:
            return await asyncio.wait_for(self._generate(messages), self.timeout)
        except TimeoutError:
            raise JudgeError(f"the judge did not answer within timeout={self.timeout}s") from None

    async def _generate(self, messages: list[dict[str, str]]) -> str:
        if self.base_url is not None:
            if self._client is None:
                from openai import AsyncOpenAI

                self._client = AsyncOpenAI(
                    base_url=self.base_url,
                    api_key=self.api_key or "none",
                    timeout=self.timeout,
                    max_retries=0,
                )
            try:
                out = await self._client.chat.completions.create(
                    model=self.model, messages=messages, max_tokens=self.max_tokens, temperature=0.0
                )
            except Exception as exc:
                raise JudgeError(f"the judge at {self.base_url} failed: {type(exc).__name__}: {exc}") from exc
            return out.choices[0].message.content or ""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # some tokenizers answer a BatchEncoding
            ids = ids["input_ids"]
        eos = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        request = ModelRequest(
            input_ids=list(ids),
            tokenizer=self.tokenizer,
            gconfig=GenerationConfig(
                max_new_tokens=self.max_tokens, greedy=True, temperature=0.0, stop_token_ids=eos
            ),
        )
        if self.engine is None or isinstance(self.engine, str):  # checked when the judge was made
            raise JudgeError("this judge has neither base_url nor an engine to ask")
        response = await self.engine.agenerate(request)
        return self.tokenizer.decode(response.output_tokens, skip_special_tokens=True)

    # ---------------------------------------------------------------- scoring
    def _key(self, *parts: Any) -> str:
        return hashlib.sha256(json.dumps([self.rubric, *parts], default=str).encode()).hexdigest()

    async def score(self, row: Mapping[str, Any] | str, completion: Any) -> float:
        """One reply's score in [0, 1] (cached per rubric, task and reply)."""
        task, reply = _task_text(row), _completion_text(completion)
        key = self._key("pointwise", task, reply)
        if key not in self._cache:
            answer = await self._ask(
                [
                    {"role": "system", "content": POINTWISE_SYSTEM},
                    {
                        "role": "user",
                        "content": f"Rubric:\n{self.rubric}\n\nTask:\n{task}\n\nResponse:\n{reply}",
                    },
                ]
            )
            self._remember(key, self._read_score(answer))
        self._cache.move_to_end(key)
        return self._cache[key]

    async def score_group(self, row: Mapping[str, Any] | str, completions: Sequence[Any]) -> list[float]:
        """Each reply's score in [0, 1], judged relative to the others in one call (cached per group)."""
        task = _task_text(row)
        replies = [_completion_text(c) for c in completions]
        if not replies:
            return []
        key = self._key("group", task, replies)
        if key not in self._cache:
            listing = "\n\n".join(f"[{i}]\n{reply}" for i, reply in enumerate(replies, 1))
            answer = await self._ask(
                [
                    {"role": "system", "content": _GROUP_SYSTEM},
                    {
                        "role": "user",
                        "content": f"Rubric:\n{self.rubric}\n\nTask:\n{task}\n\nResponses:\n\n{listing}",
                    },
                ]
            )
            self._remember(key, parse_group_scores(answer, len(replies)))
        self._cache.move_to_end(key)
        return list(self._cache[key])

    def _read_score(self, answer: str) -> float:
        """The pointwise score `parse` reads from the answer; anything it cannot read is a JudgeError."""
        try:
            value = (self.parse or parse_score)(answer)
        except JudgeError:
            raise
        except Exception as exc:
            raise JudgeError(
                f"parse could not read the judge's answer ({type(exc).__name__}: {exc}): {_quote(answer)}"
            ) from exc
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            raise JudgeError(
                f"parse read {value!r} (not a number in [0, 1]) from the judge's answer: {_quote(answer)}"
            )
        return float(value)

    def _remember(self, key: str, value: Any) -> None:
        self._cache[key] = value
        while len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)

    async def __call__(self, row: Mapping[str, Any], completion: Any) -> float:
        if self.mode == "pointwise":
            return await self.score(row, completion)
        return await self._join_group(row, completion)

    # ---------------------------------------------------------------- group gathering
    async def _join_group(self, row: Mapping[str, Any], completion: Any) -> float:
        loop = asyncio.get_running_loop()
        key = self._key("row", json.dumps(dict(row), sort_keys=True, default=str))
        gathering = self._open.get(key)
        if gathering is None:
            gathering = self._open[key] = _Gathering(row)
            gathering.timer = loop.call_later(self.group_wait, self._close_group, key, gathering)
        future = loop.create_future()
        gathering.completions.append(_completion_text(completion))
        gathering.futures.append(future)
        assert self.group_size is not None  # mode "group" checked it when the judge was made
        if len(gathering.futures) >= self.group_size:
            self._close_group(key, gathering)
        return await future

    def _close_group(self, key: str, gathering: _Gathering) -> None:
        """Score the gathered replies (the group is full, or waited `group_wait`) in one call."""
        if self._open.get(key) is gathering:
            del self._open[key]
        if gathering.timer is not None:
            gathering.timer.cancel()
            gathering.timer = None
        if not gathering.futures or all(f.done() for f in gathering.futures):
            return

        async def judge_now() -> None:
            try:
                scores = await self.score_group(gathering.row, gathering.completions)
            except Exception as exc:  # noqa: BLE001 - every waiting member gets the judge's failure
                for f in gathering.futures:
                    if not f.done():
                        f.set_exception(exc)
                return
            for f, value in zip(gathering.futures, scores, strict=True):
                if not f.done():
                    f.set_result(value)

        asyncio.get_running_loop().create_task(judge_now())

    def __repr__(self) -> str:
        where = self.base_url or (
            "the Session's initial policy" if self.needs_session_engine else "an engine"
        )
        return f"Judge({self.mode}, {where}, rubric={self.rubric[:40]!r})"


def judge(rubric: str, **options: Any) -> Judge:
    """A reward that asks an LLM to score replies against `rubric` (see the module's doc):
    `Judge(rubric, **options)`, whose keywords are the options (`mode`, `base_url`, `api_key`,
    `model`, `engine`, `tokenizer`, `timeout`, `max_tokens`, `group_size`, `group_wait`, `parse`).

    `parse(answer) -> float in [0, 1]` reads a pointwise answer in a format of your own (default:
    the last `SCORE: x`, or the answer as one number)."""
    return Judge(rubric, **options)


def session_judges(agent: Any) -> list[Judge]:
    """The judges an agent holds (its attributes, one level down) that wait for the Session's engine."""
    found: dict[int, Judge] = {}
    for value in list(getattr(agent, "__dict__", {}).values()):
        if isinstance(value, Judge) and value.needs_session_engine:
            found[id(value)] = value
    return list(found.values())
