"""Imports every built-in policy so its registry entry exists; the rest of the project reads registries from here."""

from policies import disagg, prefill_first, routing, seed_toy, static, token_budget  # noqa: F401  (registration side effects)
from policies.kv_blocks import BlockManager
from policies.ordering import orderings
from policies.prefix_blocks import PrefixCachingBlockManager
from policies.radix import RadixCache
from policies.registry import kv_managers, routers, schedulers

kv_managers.register("none")(BlockManager)
kv_managers.register("vllm")(PrefixCachingBlockManager)
kv_managers.register("radix")(RadixCache)

__all__ = ["kv_managers", "orderings", "routers", "schedulers"]
