"""Domain errors, declared once: what a domain refuses, in words safe to show the caller.

A domain raises these (a newsletter that does not exist, a state that forbids the change, a value
the model alone cannot judge); it knows nothing of HTTP. Each kind is one answer of the JSON API,
mapped in one place (app/platform/http.py `ApiError.of`, applied by every route `api_route` declares):

    NotFound     404 not_found
    Conflict     409 conflict
    Invalid      422 validation_failed, with {field, message} (and `index` for an item of a batch)
    Unavailable  503 unavailable (Retry-After when `retry_after` is given)

A subclass may name its own `code` (a test send refused by the emergency stop is `sending_stopped`).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["Conflict", "DomainError", "Invalid", "NotFound", "Unavailable", "problem"]


def problem(field: str, message: str, index: int | None = None) -> dict[str, object]:
    """One entry of a 422's `errors`: {field, message}, {index, field, message} for an item of a batch."""
    entry: dict[str, object] = {"field": field, "message": message}
    return entry if index is None else {"index": index, **entry}


class DomainError(Exception):
    """Base of the errors below: `status` and `code` say how the API answers it."""

    status: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    @property
    def problems(self) -> list[dict[str, object]] | None:
        """The per-field problems (an Invalid's), or None."""
        return None

    @property
    def retry_after(self) -> int | None:
        return None


class NotFound(DomainError):
    """What the request names does not exist (the message says what: "no newsletter with that id")."""

    status, code = 404, "not_found"


class Conflict(DomainError):
    """The resource's state forbids the change; `state` is that state when there is one."""

    status, code = 409, "conflict"

    def __init__(self, message: str, state: str | None = None):
        super().__init__(message)
        self.state = state


class Invalid(DomainError):
    """The request's values are refused: one problem (`Invalid(field, message)`) or several
    (`Invalid.of(problems)`, each made by `problem`)."""

    status, code = 422, "validation_failed"

    def __init__(self, field: str, message: str, index: int | None = None):
        self._problems = [problem(field, message, index)]
        super().__init__(self._summary())

    @classmethod
    def of(cls, problems: list[dict[str, object]]) -> Invalid:
        error = cls.__new__(cls)
        error._problems = list(problems)
        DomainError.__init__(error, error._summary())
        return error

    def _summary(self) -> str:
        return f"{len(self._problems)} problem(s) in the request; nothing was stored"

    @property
    def problems(self) -> list[dict[str, object]]:
        return self._problems


class Unavailable(DomainError):
    """A dependency failed as a whole and nothing was done: the caller may retry (after `retry_after` s)."""

    status, code = 503, "unavailable"

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        self._retry_after = retry_after

    @property
    def retry_after(self) -> int | None:
        return self._retry_after
