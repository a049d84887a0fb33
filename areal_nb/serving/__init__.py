"""What the proxy and the engine-server share to serve HTTP: a request body read whole within a
size and a time limit (`body`), work cancelled when its client disconnects (`disconnect`), the
caller's key (`auth`), and errors answered in a client's dialect (`errors`); and, for those that
start servers, the probe of a starting server's health (`health`).

Each app keeps what is its own: the proxy's checks on a body's JSON (`proxy/limits.py`) and its
routes, the engine-server's SGLang routes.
"""

from .auth import bearer_token_of, keys_equal
from .body import BodyOverLimit, BodyTimedOut, read_bounded_body
from .disconnect import ClientGone, unless_client_leaves
from .errors import error_json
from .health import answers_health

__all__ = [
    "BodyOverLimit",
    "BodyTimedOut",
    "ClientGone",
    "answers_health",
    "bearer_token_of",
    "error_json",
    "keys_equal",
    "read_bounded_body",
    "unless_client_leaves",
]
