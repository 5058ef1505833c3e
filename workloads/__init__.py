"""Request workloads: scenario config (config.py, with dist_config.py and sharing_config.py), trace
loaders (traces.py, servegen.py), arrival processes (arrivals.py), length distributions
(distributions.py), shared prefixes and semantic clusters (prefixes.py), multi-turn sessions
(sessions.py), and `build_workload` (generate.py), which turns a `WorkloadConfig` and a numpy
Generator into `Request`s (request.py, which also states the prefix identity rules).
prefix_stats.py gives reference prefix-hit numbers. Depends on nothing else in the project."""
