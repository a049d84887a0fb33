"""What goes wrong with an environment from the ecosystem."""


class EnvironmentServerError(RuntimeError):
    """An environment's server cannot be started or reached, dropped the session or refused a message.

    Raised inside an episode, it rejects that episode with this message; the run goes on."""
