"""`ProxySettings` and the admin-key rule for non-loopback binds."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Any

from areal_nb.errors import InvalidArgumentError

DEFAULT_ADMIN_API_KEY = "areal-admin-key"
_ALLOW_DEFAULT_KEY_ENV = "AREAL_ALLOW_DEFAULT_ADMIN_KEY"
DEFAULT_SESSION_TIMEOUT = 3600.0  # seconds without a call before a session is swept


@dataclass
class ProxySettings:
    """Everything one proxy app needs besides its engine and tokenizer.

    `completion` is an `areal_nb.capture.CompletionSettings` (None → its defaults).
    """

    admin_api_key: str = DEFAULT_ADMIN_API_KEY
    session_timeout: float = DEFAULT_SESSION_TIMEOUT
    sweep_interval: float = 60.0  # stale sessions are looked for at most this often
    export_wait_timeout: float = 300.0  # export waits this long for end_session → 504
    max_body_bytes: int = 8 * 1024 * 1024  # larger request bodies → 413
    body_timeout: float = 30.0  # a request body not complete this many seconds after its headers → 408
    model_name: str = "areal-nb"  # what GET /v1/models lists
    completion: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.admin_api_key, str) or not self.admin_api_key.strip():
            raise InvalidArgumentError("admin_api_key must be a non-empty string")
        for name in ("session_timeout", "export_wait_timeout", "body_timeout"):
            if getattr(self, name) <= 0:
                raise InvalidArgumentError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.sweep_interval < 0:
            raise InvalidArgumentError(f"sweep_interval must be >= 0, got {self.sweep_interval}")
        if self.max_body_bytes < 1024:
            raise InvalidArgumentError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def validate_admin_key(admin_api_key: str, host: str) -> None:
    """Refuse the well-known default admin key when the proxy is reachable from outside.

    The default key is public; on 0.0.0.0 or a LAN address anyone could export or hijack
    sessions. Set `AREAL_ALLOW_DEFAULT_ADMIN_KEY=1` to override on a trusted network.
    """
    if admin_api_key != DEFAULT_ADMIN_API_KEY or is_loopback(host):
        return
    if os.environ.get(_ALLOW_DEFAULT_KEY_ENV) == "1":
        return
    raise InvalidArgumentError(
        f"refusing to serve on non-loopback host {host!r} with the default admin key "
        f"{DEFAULT_ADMIN_API_KEY!r}: pass a secret admin key (--admin-key / "
        f"ProxySettings(admin_api_key=...)) or set {_ALLOW_DEFAULT_KEY_ENV}=1"
    )
