"""Imports every built-in policy so its registry entry exists; the rest of the project reads registries from here."""

from servesim.policies import disagg, prefill_first, routing, seed_toy, static, token_budget, trtllm  # noqa: F401  (registration side effects)
from servesim.policies.kv_blocks import BlockManager
from servesim.policies.ordering import orderings
from servesim.policies.prefix_blocks import PrefixCachingBlockManager
from servesim.policies.radix import RadixCache
from servesim.policies.registry import kv_managers, routers, schedulers

from servesim.policies.config import EngineConfig
from servesim.policies.spec_decode import Speculator
from servesim.policies.step import Scheduler, TokenLog

kv_managers.register("none")(BlockManager)
kv_managers.register("vllm")(PrefixCachingBlockManager)
kv_managers.register("radix")(RadixCache)

__all__ = ["build_scheduler", "kv_managers", "orderings", "routers", "schedulers"]


def build_scheduler(
    engine: EngineConfig, kv: BlockManager, log: TokenLog, host_blocks: int = 0, seed: int = 0
) -> Scheduler:
    """`engine`'s scheduler over `kv` in its queue order, and its speculator (acceptance draws seeded by `seed`)
    when it speculates: how a replica, a pipeline stage and the calibration server each build theirs."""
    scheduler = schedulers.get(engine.scheduler)(
        kv, engine, orderings.get(engine.queue_order), log, host_blocks
    )
    if engine.speculative is not None:
        scheduler.speculator = Speculator(engine.speculative, seed)
    return scheduler
