"""The embedded engine's defaults, in one place, without torch.

`LocalEngine`, `areal_nb.config.EngineConfig` and `areal-nb engine-server` all read them from
here, so the config, the command line and the engine cannot drift apart; this module imports
nothing heavy, so the config can import it without loading torch or transformers.
"""

from __future__ import annotations

# Most requests decoded together in one step; more wait for a row to finish.
DEFAULT_MAX_BATCH_SIZE = 64

# A multi-turn batch of the demo (128 conversations of ~100 tokens) fits several times over; a
# token of KV costs layers x 2 x kv_heads x head_dim x dtype bytes (tiny-math: 4 KiB in fp32,
# Qwen2.5-1.5B: 28 KiB in bf16, so 0.9 GiB at this default).
DEFAULT_PREFIX_CACHE_TOKENS = 32768

# Decoding steps of up to this many rows run on one torch thread (CPU); 0: every step on torch's
# threads. One thread leaves the other core to the Python threads beside the engine (the Session's
# agents and proxy, a server's HTTP loop); engine/local_worker.py says what was measured.
DEFAULT_SINGLE_THREAD_ROWS = 64

# `areal-nb engine-server` started by hand runs alone on its machine: no agents or proxy beside
# it, so every decoding step uses torch's threads (1.2-1.4x the output tok/s of the setting above
# at 8-128 rows, README performance table). Servers a Session starts beside its trainer get the
# Session's `engine.single_thread_rows` instead (remote_launch.py).
DEFAULT_SERVER_SINGLE_THREAD_ROWS = 0

# engine-server request bodies: larger ones are a 413 before they are parsed (a prompt batch is
# ids, ~3-7 bytes a token, so 32 MiB is millions of tokens); one not complete this many seconds
# after its headers is a 408, so a client that trickles a body cannot hold a request for ever
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_BODY_TIMEOUT = 30.0
