"""CPU of one in-process episode on the event loop: what each inline agent's chat call costs the
proxy side, layer by layer, with the prompt memo on and off in the same run.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/inprocess_episode.py [--episodes 512] [--group 8] [--rounds 3]

An instant engine (`ScriptedEngine`, a 16-token reply) and tiny-math's tokenizer, so only the
proxy side is measured; the prompts are the single-turn benchmark's problems, each sent `--group`
times in a row as a GRPO group sends them. Per episode, the thread CPU time (`time.thread_time`)
of the calling loop, median of `--rounds` rounds, for:

- `completion`: lifecycle (grant, start, reward, end, export as direct `ProxyState` calls) and
  `create_chat_completion` called directly;
- `lane`: the same through the app's direct lane (request JSON parsed and checked, response JSON);
- `http_client`: the same through the `httpx` client inline agents get (`InProcessClient`);
- `sdk`: the same through an `AsyncOpenAI` client per episode, as `SingleTurnMathAgent` makes it.

Each layer runs with the prompt memo and without it (`max_entries=0`), interleaved; the last line
is one JSON object with the figures and `sdk_memo_over_no_memo`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REPLY = "6 - 2 = 4. The answer is 4."
ADMIN_KEY = "bench-admin-key"


def build() -> tuple:
    from areal_nb.capture import CompletionSettings
    from areal_nb.config import load_config
    from areal_nb.models import load_tokenizer
    from areal_nb.proxy import ProxySettings, create_app
    from areal_nb.session.data import DataStream, load_task_data
    from areal_nb.testing import ScriptedEngine

    cfg = load_config(ROOT / "configs" / "multi_turn_math.yaml", [])
    stream = DataStream(cfg.data, rows=load_task_data(cfg.data).train)
    problems = [next(stream)["messages"] for _ in range(256)]
    tokenizer = load_tokenizer("tiny-math")
    engine = ScriptedEngine(
        tokenizer, tokenizer.encode(REPLY, add_special_tokens=False) + [tokenizer.eos_token_id]
    )
    settings = CompletionSettings(chat_template_type="hf", default_max_new_tokens=16)
    app = create_app(engine, tokenizer, ProxySettings(admin_api_key=ADMIN_KEY, completion=settings))
    return app, engine, tokenizer, settings, problems


def episodes(app, engine, tokenizer, settings) -> dict:
    """{layer: async episode(messages)}."""
    from openai import AsyncOpenAI

    from areal_nb.capture.completion import create_chat_completion
    from areal_nb.proxy.inprocess import InProcessProxyClient, asgi_http_client, direct_routes

    state = app.state.proxy
    lane = direct_routes(app)["/v1/chat/completions"]
    base_url = "http://proxy.invalid/v1"
    clients: dict = {}

    def http_client():
        loop = asyncio.get_running_loop()
        if clients.get("loop") is not loop:
            clients.update(loop=loop, http=asgi_http_client(app, base_url))
        return clients["http"]

    async def lifecycle(call) -> None:
        client = InProcessProxyClient(state, "bench")
        await client.grant_capacity()
        async with client:
            await call(client.session_api_key, client._session.cache)
            await client.set_last_reward(1.0)
        await client.export_interactions()

    async def completion(messages) -> None:
        async def call(key, cache):
            await create_chat_completion(
                engine=engine, tokenizer=tokenizer, settings=settings, cache=cache, messages=messages
            )

        await lifecycle(call)

    async def direct_lane(messages) -> None:
        async def call(key, cache):
            body = json.dumps({"model": "default", "messages": messages}).encode()
            response = await lane(
                "/v1/chat/completions",
                body,
                {"authorization": f"Bearer {key}", "content-type": "application/json"},
            )
            assert response.status_code == 200, response.body

        await lifecycle(call)

    async def through_http_client(messages) -> None:
        async def call(key, cache):
            response = await http_client().post(
                "chat/completions",
                json={"model": "default", "messages": messages},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert response.status_code == 200, response.text
            response.json()

        await lifecycle(call)

    async def sdk(messages) -> None:
        async def call(key, cache):
            client = AsyncOpenAI(base_url=base_url, api_key=key, http_client=http_client(), max_retries=0)
            completion = await client.chat.completions.create(model="default", messages=messages)
            assert completion.choices[0].message.content

        await lifecycle(call)

    return {"completion": completion, "lane": direct_lane, "http_client": through_http_client, "sdk": sdk}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=512, help="episodes per layer and round")
    parser.add_argument("--group", type=int, default=8, help="episodes per prompt, one after the other")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from areal_nb.capture.prompt_memo import prompt_memo

    app, engine, tokenizer, settings, problems = build()
    layers = episodes(app, engine, tokenizer, settings)
    memo = prompt_memo(tokenizer)
    cpu: dict[str, list[float]] = {}
    offset = 0

    async def run(layer, n: int) -> float:
        nonlocal offset
        start = time.thread_time()
        for i in range(n):
            await layer(problems[(offset + i // args.group) % len(problems)])
        offset += n // args.group + 1  # new prompts for every run: each group's first render misses
        engine.requests.clear()
        return (time.thread_time() - start) / n * 1e3

    for layer in layers.values():
        asyncio.run(run(layer, 16))  # warm up
    for _ in range(args.rounds):
        for name, layer in layers.items():
            for memoised in (True, False):
                memo.max_entries = 512 if memoised else 0
                memo.clear()
                cpu.setdefault(f"{name}{'' if memoised else '_no_memo'}", []).append(
                    asyncio.run(run(layer, args.episodes))
                )
    memo.max_entries = 512
    result = {k: round(statistics.median(v), 3) for k, v in cpu.items()}
    for name in layers:
        print(
            f"{name:>12}: {result[name]:.3f} ms CPU per episode with the prompt memo, "
            f"{result[name + '_no_memo']:.3f} ms without"
        )
    result["sdk_memo_over_no_memo"] = round(result["sdk"] / result["sdk_no_memo"], 3)
    result["load_average"] = round(os.getloadavg()[0], 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
