"""Errors meant for users, not developers.

``UserError`` is raised for bad input (a missing image, a wrong column, a malformed rubric, an unknown
config key). Its message names the file, row and field. The command line prints it as one paragraph
and exits with status 2, without a traceback.
"""


class UserError(Exception):
    """Bad input from the user; the message says what and where (file, row, field)."""


class DataError(UserError):
    """A dataset row could not be turned into a Sample. ``row`` and ``field`` say where."""

    def __init__(self, message: str, *, source: str | None = None, row: int | None = None,
                 field: str | None = None) -> None:
        where = []
        if source is not None:
            where.append(str(source))
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = (", ".join(where) + ": ") if where else ""
        super().__init__(prefix + message)
        self.source, self.row, self.field = source, row, field
