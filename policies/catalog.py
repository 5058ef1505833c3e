"""Imports every built-in policy so its registry entry exists; the rest of the project reads registries from here."""

from policies import routing, seed_toy, static, token_budget  # noqa: F401  (registration side effects)
from policies.ordering import orderings
from policies.registry import routers, schedulers

__all__ = ["orderings", "routers", "schedulers"]
