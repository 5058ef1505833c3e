"""The SimPy world: replicas, their engine loop, fast-forward, P/D hand-off, pipelines and the metrics they record."""
