"""Errors meant for users, not developers.

``UserError`` is raised for bad input (a missing image, a wrong column, a malformed rubric, an unknown
config key). Its message names the file, row and field. The command line prints it as one paragraph
and exits with status 2, without a traceback.
"""


class UserError(Exception):
    """Bad input from the user; the message says what and where (file, row, field)."""


class ConfigErrors(UserError):
    """Every problem found in one config at once (one line each), so a user fixes them in one pass.

    ``problems`` keeps the lines; ``str()`` is a count followed by the lines, which the CLI prints as is.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} found before loading the model:"
        super().__init__("\n".join([head, *(f"  {p}" for p in self.problems)]) if n != 1 else self.problems[0])


def did_you_mean(name: object, known: "list[str] | tuple[str, ...]") -> str:
    """`` (did you mean 'x'?)`` for the closest known name, or ``""`` when none is close (difflib ratio >= 0.6).

    >>> did_you_mean("ppo", ["ppo_clip", "gspo", "cispo"])
    " (did you mean 'ppo_clip'?)"
    >>> did_you_mean("zzz", ["grpo"])
    ''
    """
    import difflib

    if not isinstance(name, str) or not known:
        return ""
    close = difflib.get_close_matches(name, [str(k) for k in known], n=1, cutoff=0.6)
    if not close:  # also a case-insensitive or prefix hit: "PPO_CLIP", "ppo"
        low = name.lower()
        close = [k for k in known if str(k).lower() == low] or [k for k in known if str(k).lower().startswith(low) and low]
    return f" (did you mean {close[0]!r}?)" if close else ""


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
