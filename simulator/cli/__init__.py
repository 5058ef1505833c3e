"""The `servesim` command line; nothing else in servesim imports it."""
