"""Worker entry point (`dramatiq actors`): broker first, then the actor modules that bind to it.

Actors are thin: each parses its message and calls a plain function that tests call directly.
"""

from actors import broker as _broker

broker = _broker.setup()

from actors import digest, newsletter, webhooks  # noqa: E402,F401  (actors bind to the broker above)
