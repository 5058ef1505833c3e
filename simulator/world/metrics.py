"""Metrics: the run's requests as a DataFrame, and a vLLM-`bench serve`-style summary of them and of the step log
(simulator/world/step_table.py).

Definitions (the same as vLLM's benchmark, so numbers compare with measured runs):
- TTFT: first token time - arrival.
- TPOT: per request with more than one output token, (E2E - TTFT) / (output tokens - 1); it
  excludes the first token. Mean/median/percentiles are over requests.
- ITL: every gap between two consecutive tokens of a request, pooled over the completed requests (as vLLM's
  benchmark counts successful requests only: a run's stop leaves the others' gaps out). Tokens that arrive
  together (a speculative round's accepted guesses + 1) count as one streamed chunk, one gap, as in vLLM's
  benchmark; so with speculative decoding mean ITL exceeds mean TPOT, which still counts every token.
- E2EL: finish time - arrival (`e2el`).
- queue: the wait from arrival until a step first schedules the request (vLLM's `request_queue_time_seconds`);
  TTFT less it is the prefill, with any preemption and requeue after admission.
- duration: the clients' start (or the first arrival) to the last finish. Throughputs divide by it.
- goodput: completed requests meeting every given SLO (`slo_met`), per second of duration.
- slo_attainment: the share of judged requests meeting every SLO. Judged: completed, rejected (too long for
  max_model_len or the KV pool: an error, not an answer within the SLOs), and unfinished ones already known to
  miss when the run stopped (no first token past the TTFT limit, older than the E2EL limit, or a TPOT
  lower bound - time since its first token over all its gaps, requested tokens - 1 - past its limit);
  `slo_undecided` counts the other unfinished ones, which could still make it.
- unfinished: requests that arrived but were neither completed nor rejected when the run stopped
  (`stop.max_sim_time_s`): the backlog. `not_arrived`: requests of the workload due at or after the stop (or
  session turns never released), which the run never saw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd

from servesim.simulator.world.spill import spilled_stats
from servesim.simulator.world.step_table import StepFigures
from servesim.workloads.request import Request


def request_frame(requests: list[Request]) -> pd.DataFrame:
    """Per-request table: times in seconds, token counts, latencies, preemptions, replica, rejection reason."""
    return request_table(request_columns(requests))


def request_columns(requests: list[Request]) -> dict[str, list]:
    """The per-request table's columns as lists, read off the requests (the compiled loop gives the same from its
    arrays: `compiled_run`)."""
    return {
        "request_id": [r.id for r in requests],
        "arrival_s": [r.arrival_s for r in requests],
        "first_token_s": [r.first_token_s for r in requests],
        "finish_s": [r.finish_s for r in requests],
        "prompt_tokens": [r.num_prompt_tokens for r in requests],
        "output_tokens": [r.num_generated for r in requests],
        "requested_output_tokens": [r.num_output_tokens for r in requests],
        "cached_tokens": [r.num_cached_tokens for r in requests],
        "preemptions": [r.num_preemptions for r in requests],
        "replica": [r.replica for r in requests],
        "dp_rank": pd.array(
            [r.extra.get("dp_rank") for r in requests], dtype="Int64"
        ),  # DP attention: its rank
        # (P/D: the decode rank); missing where it never reached one
        "scheduled_s": [r.scheduled_s for r in requests],
        "session_id": [r.session_id for r in requests],
        "reject_reason": [r.reject_reason for r in requests],
        "served_by": [r.served_by for r in requests],
        "false_hit": [r.false_hit for r in requests],
        "prefill_replica": [r.extra.get("prefill_replica") for r in requests],
        "prefill_end_s": [r.extra.get("prefill_end_s") for r in requests],
        "decode_wait_s": [r.extra.get("decode_wait_s") for r in requests],
        "kv_transfer_s": [r.extra.get("kv_transfer_s") for r in requests],
        "kv_transfer_bytes": [r.extra.get("kv_transfer_bytes") for r in requests],
        "decode_hit_tokens": [r.extra.get("decode_hit_tokens") for r in requests],
        "stage_wait_s": [r.extra.get("stage_wait_s") for r in requests],
    }


def request_table(rows: dict[str, list | np.ndarray]) -> pd.DataFrame:
    """The per-request table of `request_columns`' columns, with the latencies derived from them."""
    df = pd.DataFrame(rows).astype(
        {
            "scheduled_s": float,
            "first_token_s": float,
            "finish_s": float,
            "prefill_end_s": float,
            "decode_wait_s": float,
            "kv_transfer_s": float,
            "kv_transfer_bytes": float,
            "decode_hit_tokens": float,
            "stage_wait_s": float,
        }
    )
    df["queue_s"] = df["scheduled_s"] - df["arrival_s"]
    df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
    df["e2el_s"] = df["finish_s"] - df["arrival_s"]
    multi = df["output_tokens"] > 1
    df["tpot_s"] = np.where(
        multi, (df["e2el_s"] - df["ttft_s"]) / (df["output_tokens"] - 1).clip(lower=1), np.nan
    )
    return df


def _stats(prefix: str, values_s: np.ndarray) -> dict[str, float]:
    values_ms = np.sort(np.asarray(values_s, dtype=float)) * 1e3  # sorted: sums independent of record order
    values_ms = values_ms[~np.isnan(values_ms)]
    if not len(values_ms):
        return {f"{k}_{prefix}_ms": float("nan") for k in ("mean", "median", "std", "p90", "p99")}
    return {
        f"mean_{prefix}_ms": float(values_ms.mean()),
        f"median_{prefix}_ms": float(np.median(values_ms)),
        f"std_{prefix}_ms": float(values_ms.std()),
        f"p90_{prefix}_ms": float(np.percentile(values_ms, 90)),
        f"p99_{prefix}_ms": float(np.percentile(values_ms, 99)),
    }


def summarize(
    requests: pd.DataFrame,
    steps: StepFigures,
    itl_s: np.ndarray | Callable[[], Iterator[np.ndarray]],
    slo_ms: dict[str, float] | None = None,
    stop_s: float | None = None,
    start_s: float | None = None,
) -> dict[str, float]:
    """The run's summary with vLLM bench serve's key names where one exists. SLO keys: ttft, tpot, e2el.
    `itl_s`: the gaps, or a reader of their chunks where they were spilled (simulator/world/spill.py).
    `stop_s`: when the run was cut off, if it was (unfinished requests are judged against it). `start_s`: when the
    client started, which the duration counts from (vllm bench serve's clock starts before its first request's
    gap); None: the first arrival."""
    done = requests[requests["finish_s"].notna()]
    rejected = int(requests["reject_reason"].notna().sum())
    open_ = requests["finish_s"].isna() & requests["reject_reason"].isna()
    arrived = sent_mask(requests, stop_s)
    unfinished = unfinished_requests(requests, stop_s)
    start_s = requests["arrival_s"].min() if start_s is None else start_s
    duration = float(done["finish_s"].max() - start_s) if len(done) else 0.0
    # none: 0/s
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0 if x == 0 else float("nan"))
    out_tokens, in_tokens = int(done["output_tokens"].sum()), int(done["prompt_tokens"].sum())
    summary = {
        "completed": len(done),
        "rejected": rejected,
        "unfinished": len(unfinished),
        "not_arrived": int((open_ & ~arrived).sum()),
        "duration_s": duration,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": per_s(len(done)),
        "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(in_tokens + out_tokens),
        **_stats("ttft", done["ttft_s"]),
        **_stats("tpot", done["tpot_s"]),
        **(_stats("itl", itl_s) if isinstance(itl_s, np.ndarray) else spilled_stats("itl", itl_s)),
        **_stats("e2el", done["e2el_s"]),
        **_stats("queue", done["queue_s"]),
        "preemptions": int(requests["preemptions"].sum()),
        "num_steps": steps.num_steps,
        "kv_cache_usage_mean": steps.kv_cache_usage_mean,
        "kv_cache_usage_max": steps.kv_cache_usage_max,
    }
    if slo_ms:
        good = np.ones(len(done), bool)
        for metric, limit in slo_ms.items():
            column = done[f"{metric}_s"].to_numpy() * 1e3
            good &= ~(column > limit)  # NaN (e.g. TPOT of a 1-token answer) does not violate
        summary["request_goodput"] = per_s(int(good.sum()))
        summary["slo_met"] = int(good.sum())
        missed = int(known_misses(unfinished, slo_ms, stop_s).sum()) if stop_s is not None else 0
        judged = len(done) + rejected + missed
        summary["slo_attainment"] = float(good.sum() / judged) if judged else float("nan")
        summary["slo_undecided"] = len(unfinished) - missed
    return summary


def sent_mask(requests: pd.DataFrame, stop_s: float | None) -> pd.Series:
    """Requests the run sent: those with an arrival time (closed-loop ones never sent have none) that is, for a run
    cut off at `stop_s`, before it: simpy's run(until=stop) runs no event at the stop itself."""
    sent = requests["arrival_s"].notna()
    return sent & (requests["arrival_s"] < stop_s) if stop_s is not None else sent


def unfinished_requests(requests: pd.DataFrame, stop_s: float | None) -> pd.DataFrame:
    """Requests sent but neither completed nor rejected when the run stopped (the summary's `unfinished`)."""
    return requests[
        requests["finish_s"].isna() & requests["reject_reason"].isna() & sent_mask(requests, stop_s)
    ]


def known_misses(unfinished: pd.DataFrame, slo_ms: dict[str, float], stop_s: float) -> np.ndarray:
    """Which `unfinished` requests (rows of request_frame) cannot meet `slo_ms` whatever happens after `stop_s`."""
    waited_ms = (stop_s - unfinished["arrival_s"].to_numpy()) * 1e3
    first = unfinished["first_token_s"].to_numpy()
    miss = np.zeros(len(unfinished), bool)
    if "ttft" in slo_ms:
        ttft_ms = np.where(np.isnan(first), waited_ms, unfinished["ttft_s"].to_numpy() * 1e3)
        miss |= ttft_ms > slo_ms["ttft"]
    if "e2el" in slo_ms:
        miss |= waited_ms > slo_ms["e2el"]
    if "tpot" in slo_ms:  # its last token comes after stop_s, so TPOT > (stop - first) / (requested - 1)
        gaps = (unfinished["requested_output_tokens"].to_numpy() - 1).clip(min=1)
        miss |= ~np.isnan(first) & ((stop_s - first) / gaps * 1e3 > slo_ms["tpot"])
    return miss


def cache_and_load_summary(requests: pd.DataFrame, steps: StepFigures, replicas: list[int]) -> dict:
    """Prefix-cache, response-cache and per-replica load figures.

    - prefix_cache_hit_rate: prompt tokens served from the KV prefix cache at first admission / prompt tokens
      of the requests an engine scheduled (as vLLM counts lookups; one still queued at a stop was never looked
      up). `prefill_tokens_saved` is the numerator.
    - response_cache_hit_rate: requests answered by an application cache / all requests; false hits are
      semantic answers to another question. `gpu_time_saved_s`: the forward positions they would have needed
      (prompt + output - 1) times the run's GPU-seconds per forward position of a token kept: prefill tokens
      (recomputes included) and emitted decode tokens, not rejected draft guesses.
    - replica_requests / load_imbalance: requests each of `replicas` served (the engines requests finish on:
      under P/D, the decode pool's); busiest / mean.
    """
    engine = requests[requests["served_by"] == "engine"]
    looked_up = engine[engine["scheduled_s"].notna()]
    prompt = int(looked_up["prompt_tokens"].sum())
    cached = int(looked_up["cached_tokens"].sum())
    cache_hits = requests[requests["served_by"].fillna("engine").str.endswith("_cache")]
    positions = steps.prefill_tokens + int((engine["output_tokens"] - 1).clip(lower=0).sum())
    gpu_s_per_position = steps.gpu_s / positions if positions else 0.0
    per_replica = engine["replica"].value_counts().reindex(replicas, fill_value=0)
    return {
        "prefix_cache_hit_rate": cached / prompt if prompt else 0.0,
        "prefill_tokens_saved": cached,
        "response_cache_hits": len(cache_hits),
        "response_cache_hit_rate": len(cache_hits) / len(requests) if len(requests) else 0.0,
        "response_cache_false_hits": int(cache_hits["false_hit"].sum()),
        "gpu_time_saved_s": float(
            (cache_hits["prompt_tokens"] + cache_hits["requested_output_tokens"] - 1).sum()
        )
        * gpu_s_per_position,
        "replica_requests": [int(n) for n in per_replica],
        "load_imbalance": float(per_replica.max() / per_replica.mean()) if per_replica.mean() > 0 else 0.0,
    }


def transfer_summary(requests: pd.DataFrame, prefill: StepFigures, decode: StepFigures) -> dict:
    """P/D disaggregation: KV hand-off time (wire, after the prefill), decode-block wait, bytes moved, prompt
    tokens the decode side found in its own prefix cache (not sent), and each pool's KV usage from its own steps
    (the decode pool's is the run's, as its memory plan is; the two pools' steps averaged together mean neither)."""
    moved = requests[requests["kv_transfer_s"].notna()]
    return {
        "kv_cache_usage_mean": decode.kv_cache_usage_mean,
        "kv_cache_usage_max": decode.kv_cache_usage_max,
        "prefill_kv_cache_usage_mean": prefill.kv_cache_usage_mean,
        "prefill_kv_cache_usage_max": prefill.kv_cache_usage_max,
        **_stats("kv_transfer", moved["kv_transfer_s"]),
        **_stats("decode_wait", moved["decode_wait_s"]),
        "kv_transfer_bytes": float(moved["kv_transfer_bytes"].sum()),
        "kv_transfers": len(moved),
        "decode_hit_tokens": int(moved["decode_hit_tokens"].sum()),
    }
