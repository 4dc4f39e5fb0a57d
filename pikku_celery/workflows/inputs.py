"""Values a caller hands to a workflow (a run's arguments, a step's, an event's data).

The store says of any value it cannot keep as JSON to "return JSON types", which is
right for a result and wrong for these: the caller passes them, so that is what
it is told to fix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pikku_celery.errors import SerializationError

__all__ = ["passed_in"]


@contextlib.contextmanager
def passed_in(what: str) -> Iterator[None]:
    """A value the caller passed (``what``: "input of workflow 'x'") that is not JSON is
    a ``SerializationError`` that tells the caller to pass JSON."""
    try:
        yield
    except SerializationError as exc:
        cause = exc.__cause__
        # Only the codec's "not a JSON type" error; one too large or with a NUL character
        # already says what to do with the value, whoever made it.
        if type(exc) is not SerializationError or not isinstance(
            cause, TypeError | ValueError | RecursionError
        ):
            raise
        raise SerializationError(
            f"The {what} cannot be stored as JSON ({cause}); pass JSON types (dict, list, "
            "str, int, float, bool, None) as input, or convert the value first (a datetime "
            "to an ISO string, an object to its id)."
        ) from cause
