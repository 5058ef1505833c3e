"""The simulator against measured benchmark runs: replays, per-figure errors, out-of-sample judgement."""
