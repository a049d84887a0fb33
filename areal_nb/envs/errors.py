"""What goes wrong with an environment from the ecosystem (the class lives in `areal_nb.errors`)."""

from areal_nb.errors import EnvironmentServerError

__all__ = ["EnvironmentServerError"]
