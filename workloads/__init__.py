"""Request workloads: scenario config (config.py), trace loaders (traces.py, servegen.py), arrival
processes (arrivals.py), length distributions (distributions.py), and `build_workload`
(generate.py), which turns a `WorkloadConfig` and a numpy Generator into `Request`s (request.py).
Depends on nothing else in the project."""
