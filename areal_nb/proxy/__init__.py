"""The proxy: OpenAI/Anthropic-compatible endpoints that record every call for training."""

from .app import create_app
from .client import OpenAIProxyClient, ProxyRequestError, RetryPolicy
from .server import ProxyServer
from .settings import DEFAULT_ADMIN_API_KEY, ProxySettings

__all__ = [
    "DEFAULT_ADMIN_API_KEY",
    "OpenAIProxyClient",
    "ProxyRequestError",
    "ProxyServer",
    "ProxySettings",
    "RetryPolicy",
    "create_app",
]
