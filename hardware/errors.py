"""One error type for bad specs and bad input, so the CLI can print it as one clear line."""

import difflib
from collections.abc import Sequence


class SpecError(ValueError):
    """A spec, config file or argument is wrong; the message names the file, field and allowed values."""


class ShardingError(SpecError):
    """The engines would refuse to shard the model so (heads, KV heads, layers or experts that the parallel sizes
    do not divide), whatever the memory."""


def choices(values: Sequence[str], given: object = None, listed_by: str = "", width: int = 100) -> str:
    """`values` as a phrase short enough for a one-line error: all of them when they fit in `width` characters,
    else the few nearest `given` and how many more there are (and what lists them), so no line runs to 600; with
    none near and a command that lists them, just their count and that command."""
    text = ", ".join(values)
    if len(text) <= width:
        return text
    lowered = {value.lower(): value for value in values}
    near = (
        difflib.get_close_matches(str(given).lower(), list(lowered), n=3, cutoff=0.5)
        if given is not None
        else []
    )
    if not near and listed_by:
        return f"{len(values)}, see {listed_by}"
    shown = [lowered[value] for value in near] or list(values[:3])
    rest = f"{len(values) - len(shown)} more" + (f": {listed_by}" if listed_by else "")
    return f"{', '.join(shown)}, ... ({rest})"
