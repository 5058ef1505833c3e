"""The hand-off between a prefill pool and a decode pool: pick a decode replica, wait for its blocks,
move the KV, and admit the request there.

TTFT counts all of it: the first token is the one the decode replica samples once it holds the KV
(policies/disagg.py). vLLM's proxy sends the request on to the decode instance once the prefill instance
answers, so it passes the decode side's own API server first (priced as the prefill side's, by the decode
pool's profile), and the decode engine reserves its blocks and starts the pull at its next schedule. Streaming
(push) connectors send each layer as the prefill computes it: the decode engine reserves at once and admits the
request once both the KV and its API server's hand-over are in; the prompts of one prefill step share the
sender's link as their layers are computed, so each lands once the step's bytes up to its own are through. A KV
store decouples the two sides: the prefill writes each prompt as it is done and frees its blocks, the decode side
reads it once it has reserved. Per request the run records the wait from the prefill's end to the decode side's
reservation (its API server, its next step, backpressure), the decode side's own prefix hit (not sent), and the
transfer time and the bytes the decode GPUs receive.
A replica's NICs send (prefill) or receive (decode) one transfer at a time, so many prefill replicas feeding
one decode replica share its bandwidth; a transfer starts once both its ends are free, so one waiting for a busy
decode replica holds up no other from its prefill replica; under DP attention each attention rank's GPUs hold
their own requests' KV and send or receive them on their own NICs, a transfer at a time per rank.
Sliding-window layers send only the blocks still in their window (vLLM's NixlConnector with the hybrid KV
cache manager, on by default since it supports it), unless `disable_hybrid_kv_cache_manager` keeps every
layer whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import simpy

from servesim.hardware.kv_groups import kv_groups, live_kv_bytes
from servesim.hardware.memory import kv_bytes_per_replica_token
from servesim.hardware.model import ModelSpec
from servesim.policies.config import EngineConfig
from servesim.policies.disagg import DecodeScheduler, PrefillScheduler
from servesim.policies.families import VLLM
from servesim.simulator.disagg_config import TransferConfig
from servesim.simulator.world.engine import Replica
from servesim.simulator.world.frontend import Frontend
from servesim.simulator.scenario import ParallelismConfig
from servesim.workloads.request import Request


def streamed_transfer_s(total_s: float, compute_s: float, num_layers: int) -> float:
    """Time the transfer adds after the prefill ends when layer i's KV leaves as soon as layer i is done.

    Layer i (of L) finishes at (i + 1) * compute_s / L and its KV takes total_s / L on the wire, one
    layer after another: the last byte lands max_i((i + 1) * c / L + (L - i) * x / L) after the prefill
    started. When compute per layer outpaces the link that is c + x / L: one layer's transfer after it ends.
    """
    layers = num_layers
    finish = max((i + 1) * compute_s / layers + (layers - i) * total_s / layers for i in (0, layers - 1))
    return max(finish - compute_s, 0.0)


@dataclass(frozen=True)
class KVPlacement:
    """Where a request's KV lies in one replica: `share` of its distinct bytes on each of `gpus` GPUs.

    TP ranks split the KV heads (each keeps one duplicated head when TP exceeds them) and every rank keeps
    MLA's whole latent, so shares can sum to more than 1; pipeline stages split the layers. Under DP
    attention a request lives on one attention rank per stage, with all of its heads there."""

    share: float
    gpus: int

    @classmethod
    def of(cls, model: ModelSpec, par: ParallelismConfig) -> KVPlacement:
        """The fullest GPU's share, as the memory plan stores a token (which under DP attention averages the
        whole KV of 1/tp of the tokens over the group: one request's is whole on its rank)."""
        layout = par.spec(VLLM.scheduler)  # P/D pools run vLLM's schedulers
        per_gpu = kv_bytes_per_replica_token(model, "bf16", layout) / model.kv_bytes_per_token("bf16")
        if par.dp_attention:
            return cls(per_gpu * par.tp, par.pp)
        return cls(per_gpu, par.tp * par.pp)


class Handoff:
    """Moves prefilled requests from `prefill` replicas to `decode` replicas."""

    def __init__(
        self,
        env: simpy.Environment,
        model: ModelSpec,
        engine: EngineConfig,
        cfg: TransferConfig,
        link_bytes_per_s: float,
        link_latency_s: float,
        prefill: list[Replica],
        decode: list[Replica],
        route_decode: Callable[[Request], Replica],
        prefill_par: ParallelismConfig,
        decode_par: ParallelismConfig,
        frontend: Frontend,
    ):
        """`engine`: the prefill pool's settings (KV dtype, block size, hybrid KV cache manager on or off): its
        block tables are what the connector sends. `link_bytes_per_s`: one GPU's. `frontend`: the decode
        replicas' API servers."""
        self.env, self.cfg, self.model, self.engine = env, cfg, model, engine
        self.frontend = frontend
        self.groups = kv_groups(model, engine.disable_hybrid_kv_cache_manager)
        self.sender, self.receiver = KVPlacement.of(model, prefill_par), KVPlacement.of(model, decode_par)
        self.link_bytes_per_s = cfg.store_bytes_per_s if cfg.kind == "store" else link_bytes_per_s
        self.latency_s = cfg.store_latency_s if cfg.kind == "store" else link_latency_s
        # one sending and one receiving NIC set per replica (its micro-batch engines share them, keyed by the first),
        # or per attention rank of a replica under DP attention. A transfer starts once both of its ends are free,
        # the first come of those that can: one waiting for a busy decode replica holds up no other from its sender
        self._busy: set[tuple[str, int, int]] = set()
        self._pending: list[tuple[tuple[str, int, int], tuple[str, int, int], simpy.Event]] = []
        self.ranked = tuple(  # pools whose requests live on one of several attention ranks
            par.spec(VLLM.scheduler).attention_ranks > 1 for par in (prefill_par, decode_par)
        )
        # streaming: per sending NIC set, the prefill step it streams [its end, since when, wire seconds so far],
        # and when its last transfer ended
        self._streams: dict[tuple[int, int], list[float]] = {}
        self._idle_since: dict[tuple[int, int], float] = {}
        self.store = simpy.Resource(env, capacity=cfg.store_channels)
        self.route_decode = route_decode

    def on_prefilled(self, req: Request, source: Replica) -> None:
        """Called when `source` has computed the request's prompt (its sampled token is dropped)."""
        target = self.route_decode(req)
        req.extra["prefill_replica"], req.replica = source.index, target.index
        req.extra["prefill_rank"] = req.extra.get("dp_rank", 0)  # the decode group labels it with its own
        if self.cfg.kind == "store":  # saved now, whatever the decode side does (it is never streamed)
            req.extra["kv_written"] = self.env.process(self._write(req, source))
        if not self.cfg.streaming:
            self.frontend.submit(req, target, lambda r: self._offer(r, source, target, None))
            return
        entered = self.env.event()
        # the decode engine holds the request from now (an offer, then in flight): not counted twice
        self.frontend.submit(req, target, lambda r: entered.succeed(), counted=False)
        self._offer(req, source, target, entered)
        target.scheduler.grant_offers()  # a push connector's layers leave as they are computed

    def _offer(self, req: Request, source: Replica, target: Replica, entered: simpy.Event | None) -> None:
        scheduler: DecodeScheduler = target.scheduler
        scheduler.offer(req, lambda r: self.env.process(self._move(r, source, target, entered)))
        target.wake.notify()

    def _move(self, req: Request, source: Replica, target: Replica, entered: simpy.Event | None):
        reserved = self.env.now
        req.extra["decode_wait_s"] = reserved - req.extra["prefill_end_s"]
        distinct = live_kv_bytes(
            self.model,
            self.groups,
            req.num_computed_tokens,
            self.engine.block_size,
            self.engine.kv_dtype,
            req.extra["decode_hit_tokens"],
        )
        received = distinct * self.receiver.share  # by each decode GPU
        nbytes = received * self.receiver.gpus
        wire_s = max(received, nbytes / self.sender.gpus) / self.link_bytes_per_s
        if self.cfg.kind == "store":  # once written (see _write), each decode GPU reads its share
            yield req.extra.pop("kv_written")
            with self.store.request() as turn:
                yield turn
                yield self.env.timeout(received / self.link_bytes_per_s + self.latency_s)
        else:
            key = self._key(source, req.extra["prefill_rank"] if self.ranked[0] else 0)
            ends = (
                ("send", *key),
                ("receive", *self._key(target, req.extra.get("dp_rank", 0) if self.ranked[1] else 0)),
            )
            yield self._when_free(ends)
            streamed = None
            if self.cfg.streaming and reserved == req.extra["prefill_end_s"]:
                # both ends free as the step ended, or the link just through the step's prompt before
                if self.env.now == reserved or self._chained(key, req):
                    streamed = self._streamed_until(key, req, wire_s)
            if streamed is None:
                self._streams.pop(key, None)
            landed = max(streamed, self.env.now) if streamed is not None else self.env.now + wire_s
            yield self.env.timeout(landed - self.env.now + self.latency_s)
            self._idle_since[key] = self.env.now
            self._busy.difference_update(ends)
            self._start_ready()
        req.extra["kv_transfer_s"] = self.env.now - reserved
        req.extra["kv_transfer_bytes"] = nbytes
        if self.cfg.kind != "store":  # a store's copy freed the prefill's blocks already
            self._release(req, source)
        if entered is not None:  # pushed: the decode engine takes it once its API server hands it over
            yield entered
        target.scheduler.accept(req, self.env.now)
        target.wake.notify()

    def _write(self, req: Request, source: Replica):
        """A store connector saves the prompt's KV once it is computed (every block: the prefill side cannot know
        the decode side's hit), split over the prefill GPUs, then frees the prefill's blocks: the store holds it
        until a decode replica reads it, so a decode pool that is full holds up no prefill."""
        whole = live_kv_bytes(
            self.model, self.groups, req.num_computed_tokens, self.engine.block_size, self.engine.kv_dtype, 0
        )
        with self.store.request() as turn:
            yield turn
            yield self.env.timeout(whole / self.sender.gpus / self.link_bytes_per_s + self.latency_s)
        self._release(req, source)

    @staticmethod
    def _release(req: Request, source: Replica) -> None:
        prefill_sched: PrefillScheduler = source.scheduler
        prefill_sched.release(req)
        source.wake_pool()

    def _when_free(self, ends: tuple[tuple[str, int, int], tuple[str, int, int]]) -> simpy.Event:
        """An event that fires once a transfer may hold both `ends` (a sender's and a receiver's NICs)."""
        event = self.env.event()
        self._pending.append((*ends, event))
        self._start_ready()
        return event

    def _start_ready(self) -> None:
        """Start the waiting transfers whose two ends are free, first come first."""
        for item in list(self._pending):
            send, receive, event = item
            if send not in self._busy and receive not in self._busy:
                self._busy.update((send, receive))
                self._pending.remove(item)
                event.succeed()

    @staticmethod
    def _key(replica: Replica, rank: int) -> tuple[int, int]:
        """A replica's NICs (0), or those of its attention rank `rank`."""
        return _first(replica), rank

    def _chained(self, key: tuple[int, int], req: Request) -> bool:
        """Whether the sender's link has just finished another prompt of `req`'s prefill step, streamed."""
        stream = self._streams.get(key)
        return (
            stream is not None
            and stream[0] == req.extra["prefill_end_s"]
            and self._idle_since.get(key) == self.env.now
        )

    def _streamed_until(self, key: tuple[int, int], req: Request, wire_s: float) -> float:
        """When a pushed prompt's last byte lands: the layers of its prefill step's prompts leave as they are
        computed, one stream on the sender's link (from the step's start, or its last transfer's end if later), so
        it lands once the step's bytes up to its own are through (`streamed_transfer_s` of them all)."""
        end = req.extra["prefill_end_s"]
        stream = self._streams.get(key)
        if stream is None or stream[0] != end:  # the step's first prompt, the link free since its last end
            since = max(req.extra["prefill_start_s"], self._idle_since.get(key, -math.inf))
            stream = self._streams[key] = [end, since, 0.0]
        stream[2] += wire_s
        return end + streamed_transfer_s(stream[2], end - stream[1], self.model.num_layers)


def _first(replica: Replica) -> int:
    """The number of a replica's first micro-batch engine: its NICs' key, whatever its pipeline depth."""
    return min(r.index for r in (replica, *replica.siblings))
