"""The proxy: OpenAI/Anthropic-compatible endpoints that record every call for training."""

from .app import create_app
from .server import ProxyServer
from .settings import DEFAULT_ADMIN_API_KEY, ProxySettings
