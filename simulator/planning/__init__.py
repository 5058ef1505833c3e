"""Planning: capacity searches, the planner, sweeps, deployment prices and launch commands."""
