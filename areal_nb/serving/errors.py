"""An `areal_nb.errors.HTTPError` as a JSON response in a client's dialect (`render_error`)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from areal_nb.errors import Dialect, HTTPError, render_error


def error_json(error: HTTPError, dialect: Dialect) -> JSONResponse:
    reply = render_error(error, dialect)
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers or None)
