"""areal_nb: Jupyter-first agentic reinforcement learning of language models.

`from areal_nb import Session` is the entry point; the packages below it are listed in
docs/reference/packages.md; docs/getting-started.md has a tour.
"""

__version__ = "0.1.0"

__all__ = ["Session"]


def __getattr__(name: str):
    # `Session` pulls in torch, transformers and the proxy; import it only when asked for.
    if name == "Session":
        from areal_nb.session import Session

        return Session
    raise AttributeError(f"module 'areal_nb' has no attribute {name!r}")
