"""One error type for bad specs and bad input, so the CLI can print it as one clear line."""


class SpecError(ValueError):
    """A spec, config file or argument is wrong; the message names the file, field and allowed values."""


class ShardingError(SpecError):
    """The engines would refuse to shard the model so (heads, KV heads, layers or experts that the parallel sizes
    do not divide), whatever the memory."""
