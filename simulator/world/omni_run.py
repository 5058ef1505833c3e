"""Run a multi-stage (vLLM-Omni) pipeline scenario: one engine pool per stage, host transfers in between.

A request enters stage 1 when the workload sends it; when stage i finishes it, its output tensors
move device -> host over stage i's PCIe link and host -> device over stage i+1's (each hop
`latency + bytes / bandwidth`; transfers do not contend), and stage i+1 receives a new request of
`stage_lengths` tokens. The stages do not stream to each other: stage i+1 starts after stage i's
last token. A request rejected by any stage (too long, too big for its KV pool) is rejected, with
the stage named in the reason.

Results: the request table is the pipeline as a client sees it (TTFT = arrival to the last stage's
first token, E2E = arrival to its last token, output tokens = the last stage's); per-stage latencies,
transfer times and bytes go into the summary as `stage_<name>_*`; memory.json holds every stage's
memory plan with its stage-output cache's pinned host bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simpy

from servesim.hardware.errors import SpecError
from servesim.hardware.gpu import get_gpu, get_interconnect
from servesim.hardware.memory import MemoryPlan
from servesim.hardware.model import get_model
from servesim.hardware.omni_memory import PipelineMemory, StageMemory, StageTensor
from servesim.policies.catalog import routers
from servesim.policies.config import EngineConfig
from servesim.policies.step import TokenLog
from servesim.simulator.world.engine import Replica
from servesim.simulator.world.metrics import request_frame, summarize
from servesim.simulator.world.spill import SPILL_VALUES, SpilledFloats
from servesim.simulator.world.step_table import StepLog, StepTable
from servesim.simulator.omni import StageConfig, stage_lengths
from servesim.simulator.world.replicas import ReplicaSite, build_pool
from servesim.simulator.world.run import RunResult, rejection, run_seeds, workload_of
from servesim.simulator.scenario import ParallelismConfig, Scenario
from servesim.simulator.world.traffic import Traffic
from servesim.workloads.request import Phase, Request

STAGE_KEYS = ("completed", "mean_ttft_ms", "p90_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "num_steps")


@dataclass
class Stage:
    """One stage's engines and what passed through them."""

    cfg: StageConfig
    scenario: Scenario
    memory: StageMemory
    num_pages: int
    page_size: int
    tensors: tuple[StageTensor, ...]
    link_bytes_per_s: float
    link_latency_s: float
    itl_spill: SpilledFloats  # where its tokens' gaps go past SPILL_VALUES
    tokens: TokenLog = field(default_factory=TokenLog)
    replicas: list[Replica] = field(default_factory=list)
    router: object = None
    requests: list[Request] = field(default_factory=list)
    transfer_s: list[float] = field(default_factory=list)  # hand-over times of the requests it passed on
    transfer_bytes: int = 0

    def hop_s(self, nbytes: int) -> float:
        return self.link_latency_s + nbytes / self.link_bytes_per_s


def _check_stage_cache(stage: str, e: EngineConfig, memory: MemoryPlan) -> None:
    """vLLM-Omni refuses its stage-output cache, at KV-cache init, where it could not mirror one full-attention
    block table of whole blocks: sliding-window (hybrid) KV, sub-block prefix matches, speculative stages."""
    why = None
    if any(w is not None for w in memory.kv_windows) or memory.swa_window is not None:
        why = "the stage's model has sliding-window layers (hybrid KV cache groups)"
    elif e.prefix_caching == "radix" and e.radix_page_size < e.block_size:
        why = (
            f"radix pages of {e.radix_page_size} tokens match prefixes smaller than a block ({e.block_size})"
        )
    elif e.speculative is not None:
        why = "the stage decodes speculatively"
    if why:
        raise SpecError(
            f"stages[{stage!r}].cache_outputs: vLLM-Omni refuses the stage-output cache when {why}; "
            "set cache_outputs: false"
        )


def stage_scenario(s: Scenario, cfg: StageConfig) -> Scenario:
    """The scenario as one stage sees it: its model, GPU, parallelism and engine."""
    engine = s.engine_with(cfg.engine)
    return s.model_copy(
        update={
            "model": cfg.model or s.model,
            "engine": engine,
            "stages": None,
            "hardware": s.hardware.model_copy(update={"gpu": cfg.gpu or s.hardware.gpu}),
            "parallelism": ParallelismConfig(tp=cfg.tp),
        }
    ).with_engine_defaults()


class Pipeline:
    """The simulated pipeline: a pool of replicas per stage, fed by the workload's traffic."""

    def __init__(self, s: Scenario, base_dir: Path, on_progress: Callable[[int], None] | None = None):
        if s.disaggregation is not None or s.cluster.replicas != 1:
            raise SpecError(
                "stages: set replicas per stage (stages[i].replicas); disaggregation and "
                "cluster.replicas do not combine with a pipeline"
            )
        if s.parallelism != ParallelismConfig():
            raise SpecError(
                "stages: set tensor parallelism per stage (stages[i].tp); the parallelism section does "
                "not apply to a pipeline's stages, which run at pp 1 without ep or dp_attention"
            )
        if s.app_cache.kind != "none":
            raise SpecError(
                f"stages: app_cache kind {s.app_cache.kind!r} in front of a pipeline is not modelled; "
                "set app_cache.kind: none"
            )
        seeds = run_seeds(s, 2 + len(s.stages))
        self.scenario, self.on_progress, self.completed = s, on_progress, 0
        self.workload = workload_of(s, base_dir)
        self.env = simpy.Environment()
        self.steps = StepLog()
        # per stage: its request id -> the client's
        self.origin: list[dict[int, Request]] = [{} for _ in s.stages]
        self.stages: list[Stage] = []
        for i, cfg in enumerate(s.stages):
            self.stages.append(self._stage(cfg, i, np.random.default_rng(seeds[2 + i])))
        self.traffic = Traffic(
            self.env, self.workload, lambda req: self._enter(0, req, req), np.random.default_rng(seeds[1])
        )

    def _stage(self, cfg: StageConfig, index: int, rng: np.random.Generator) -> Stage:
        s = stage_scenario(self.scenario, cfg)
        itl_spill = SpilledFloats("servesim-itl-")
        tokens = TokenLog(itl_spill.spill, SPILL_VALUES)  # each stage's own: its ITL is the stage's
        site = ReplicaSite(self.env, self.steps, tokens, self.env.peek, False)
        first = sum(c.replicas for c in self.scenario.stages[:index])  # replica numbers run on across stages
        pool = build_pool(
            site,
            s,
            cfg.replicas,
            first,
            lambda replica: lambda req: self._finished(index, req),
            f"stage {cfg.name}",
        )
        model, e = get_model(s.model), pool.engine
        tensors = tuple(StageTensor(t.name, t.dims or model.hidden_size, t.dtype) for t in cfg.outputs)
        cached = ()
        if cfg.cache_outputs and e.prefix_caching != "none":
            _check_stage_cache(cfg.name, e, pool.memory)
            cached = tensors
        pcie = get_interconnect(f"pcie{get_gpu(s.hardware.gpu, tuple(s.hardware.gpu_files)).pcie_gen}")
        stage = Stage(
            cfg,
            s,
            StageMemory(cfg.name, pool.memory, pool.num_blocks, cached, cfg.replicas),
            pool.num_pages,
            pool.page_size,
            tensors,
            pcie.bytes_per_s,
            pcie.latency_s,
            itl_spill,
            tokens,
            pool.replicas,
        )
        stage.router = routers.get(cfg.router)(stage.replicas, rng)
        return stage

    # ---- a request's way through the stages ------------------------------------------------------
    def _enter(self, index: int, req: Request, origin: Request) -> None:
        stage = self.stages[index]
        stage.requests.append(req)
        self.origin[index][req.id] = origin
        reason = rejection(
            req,
            stage.scenario.engine,
            stage.memory.plan.max_model_len,
            stage.num_pages,
            stage.page_size,
            stage.memory.plan.kv_windows,
            stage.replicas[0].scheduler,
        )
        if reason:
            req.phase, req.reject_reason = Phase.REJECTED, reason
            origin.phase, origin.reject_reason = Phase.REJECTED, f"stage {stage.cfg.name}: {reason}"
            self._done(origin)
            return
        req.served_by = "engine"
        stage.router.route(req).submit(req)

    def _finished(self, index: int, req: Request) -> None:
        origin = self.origin[index][req.id]
        if index + 1 == len(self.stages):
            self._done(origin)
        else:
            self.env.process(self._hand_over(index, req, origin))

    def _hand_over(self, index: int, req: Request, origin: Request):
        src, dst = self.stages[index], self.stages[index + 1]
        nbytes = sum(t.bytes_for(req.num_prompt_tokens + req.num_generated) for t in src.tensors)
        delay = src.hop_s(nbytes) + dst.hop_s(nbytes)  # device -> host, host -> device
        src.transfer_s.append(delay)
        src.transfer_bytes += nbytes
        yield self.env.timeout(delay)
        prompt, output = stage_lengths(dst.cfg, req.num_generated)
        self._enter(
            index + 1,
            Request(
                req.id,
                self.env.now,
                prompt,
                output,
                session_id=origin.session_id,
                priority=origin.priority,
                turn=origin.turn,
            ),
            origin,
        )

    def _done(self, origin: Request) -> None:
        self.completed += 1
        if self.on_progress:
            self.on_progress(self.completed)
        self.traffic.on_done(origin)

    # ---- results ---------------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.env.run(until=self.scenario.stop.max_sim_time_s)
        steps = self.steps.table()
        requests = request_frame(self._client_view())
        last = self.stages[-1]
        summary = summarize(
            requests,
            steps.figures(),
            _itl(last),
            self.scenario.slo.as_ms(),
            stop_s=self.scenario.stop.max_sim_time_s,
            start_s=0.0,  # the clients start sending at 0
        )
        for stage in self.stages:
            summary |= self._stage_summary(stage, steps)
        memory = PipelineMemory(tuple(stage.memory for stage in self.stages))
        summary["stage_output_cache_host_bytes"] = memory.host_cache_bytes
        return RunResult(self.scenario, memory, self.stages[0].memory.num_blocks, requests, steps, summary)

    def _client_view(self) -> list[Request]:
        """Each workload request as its client sees the pipeline: its arrival, the last stage's tokens."""
        later = [{req.id: req for req in stage.requests} for stage in self.stages[1:]]
        last = later[-1] if later else {req.id: req for req in self.stages[0].requests}
        view = []
        for origin in sorted(
            [*self.workload.requests, *self.workload.followups.values()], key=lambda r: r.id
        ):
            out = last.get(origin.id)
            req = Request(
                origin.id,
                origin.arrival_s,
                origin.num_prompt_tokens,
                out.num_output_tokens if out else origin.num_output_tokens,
                session_id=origin.session_id,
                phase=origin.phase,
                reject_reason=origin.reject_reason,
            )
            if out is not None and out.reject_reason is None:
                req.first_token_s, req.finish_s, req.num_generated = (
                    out.first_token_s,
                    out.finish_s,
                    out.num_generated,
                )
                req.replica, req.served_by = out.replica, "engine"
            if req.reject_reason is None:
                req.scheduled_s = origin.scheduled_s  # the first stage's queue
                req.extra["stage_wait_s"] = sum(self._waited(stage.get(origin.id)) for stage in later)
            view.append(req)
        return view

    def _waited(self, req: Request | None) -> float:
        """How long a stage's request waited in its queue (to now if it still does; 0 if it never got there)."""
        if req is None or req.reject_reason is not None:
            return 0.0
        return (self.env.now if req.scheduled_s is None else req.scheduled_s) - req.arrival_s

    def _stage_summary(self, stage: Stage, steps: StepTable) -> dict:
        own = steps.figures(replicas={r.index for r in stage.replicas})
        stats = summarize(request_frame(stage.requests), own, _itl(stage))
        out = {f"stage_{stage.cfg.name}_{key}": stats[key] for key in STAGE_KEYS}
        transfer_ms = np.array(stage.transfer_s) * 1e3
        out[f"stage_{stage.cfg.name}_mean_transfer_ms"] = (
            float(transfer_ms.mean()) if len(transfer_ms) else 0.0
        )
        out[f"stage_{stage.cfg.name}_transfer_bytes"] = stage.transfer_bytes
        out[f"stage_{stage.cfg.name}_output_cache_host_bytes"] = stage.memory.host_cache_bytes
        return out


def _itl(stage: Stage) -> np.ndarray | Callable[[], Iterator[np.ndarray]]:
    return stage.itl_spill.gathered(stage.tokens.itl_s)
