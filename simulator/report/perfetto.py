"""A run folder as a Chrome/Perfetto trace: open it in ui.perfetto.dev or chrome://tracing to look at each engine
step and each request on a timeline.

Each replica (a prefill or decode pool's, a pipeline stage's) is a process; its steps are slices on one track,
named by what they ran (prefill, decode, mixed, preempt) with the batch's composition in their args, beside
counters of its queue and KV usage. Each request is an async slice from arrival to its last token, split into
queued, prefill and decode (under P/D, its prefill on the prefill replica and its decode on the decode one);
a rejected request is an instant event carrying the reason.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from servesim.hardware.errors import SpecError
from servesim.simulator.atomic import check_output_file, write_text_atomic
from servesim.simulator.world.output import read_table, replica_labels

US = 1e6  # the trace format counts microseconds


def _step_name(step: Any) -> str:
    if step.num_requests == 0:
        return "preempt"
    if step.prefill_tokens and step.decode_tokens:
        return "mixed"
    return "prefill" if step.prefill_tokens else "decode"


def _label(labels: list[str], replica: int) -> str:
    return labels[replica] if replica < len(labels) else f"replica {replica}"


def _step_events(steps: pd.DataFrame) -> list[dict]:
    """Each step a slice on its replica's first lane it does not overlap (a pipeline's micro-batches overlap)."""
    events, lanes = [], {}  # replica -> each lane's last end
    for step in steps.sort_values("time_s", kind="stable").itertuples(index=False):
        pid, end = int(step.replica) + 1, float(step.time_s)
        start = end - float(step.duration_s)
        ends = lanes.setdefault(pid, [])
        lane = next((i for i, last in enumerate(ends) if last <= start + 1e-12), len(ends))
        ends[lane : lane + 1] = [end]
        args = {
            "requests": int(step.num_requests),
            "prefill_tokens": int(step.prefill_tokens),
            "decode_tokens": int(step.decode_tokens),
            "running": int(step.num_running),
            "waiting": int(step.num_waiting),
            "kv_usage": round(float(step.kv_usage), 4),
            "preempted": int(step.num_preempted),
        }
        events.append(
            {"name": _step_name(step), "cat": "step", "ph": "X", "pid": pid, "tid": lane + 1}
            | {"ts": start * US, "dur": float(step.duration_s) * US, "args": args}
        )
        events.append(
            {"name": "queue", "ph": "C", "pid": pid, "ts": end * US, "args": {"waiting": args["waiting"]}}
        )
        events.append(
            {"name": "KV usage", "ph": "C", "pid": pid, "ts": end * US, "args": {"usage": args["kv_usage"]}}
        )
    return events


def _phase(name: str, rid: int, pid: int, start: float, end: float, args: dict | None = None) -> list[dict]:
    """An async slice `name` of request `rid` on process `pid` (nothing when it has no length to show)."""
    if not (math.isfinite(start) and math.isfinite(end)) or end < start:
        return []
    begin = {"name": name, "cat": "request", "ph": "b", "id": rid, "pid": pid, "ts": start * US}
    return [begin | ({"args": args} if args else {}), begin | {"ph": "e", "ts": end * US}]


def _number(value: Any) -> float:
    return float(value) if value is not None and not pd.isna(value) else math.nan


def _request_events(requests: pd.DataFrame) -> list[dict]:
    events = []
    for req in requests.to_dict("records"):
        rid, arrival = int(req["request_id"]), _number(req["arrival_s"])
        replica = _number(req.get("replica"))
        if isinstance(req.get("reject_reason"), str) and req["reject_reason"]:
            pid = int(replica) + 1 if math.isfinite(replica) else 1
            events.append(
                {"name": "rejected", "cat": "request", "ph": "i", "s": "p", "pid": pid, "ts": arrival * US}
                | {"args": {"request": rid, "reason": req["reject_reason"]}}
            )
            continue
        if not math.isfinite(replica):
            continue  # not arrived, or never routed before the run stopped
        scheduled, first, finish = (_number(req.get(k)) for k in ("scheduled_s", "first_token_s", "finish_s"))
        prefill = _number(req.get("prefill_replica"))
        prefill_pid = int(prefill) + 1 if math.isfinite(prefill) else int(replica) + 1
        args = {"prompt_tokens": int(req["prompt_tokens"]), "output_tokens": int(req["output_tokens"])}
        end = (
            finish
            if math.isfinite(finish)
            else max(x for x in (arrival, scheduled, first) if math.isfinite(x))
        )
        events += _phase(f"request {rid}", rid, prefill_pid, arrival, end, args)
        events += _phase("queued", rid, prefill_pid, arrival, scheduled)
        events += _phase("prefill", rid, prefill_pid, scheduled, first)
        events += _phase("decode", rid, int(replica) + 1, first, finish)
    return events


def trace_events(folder: Path) -> dict[str, Any]:
    """The Chrome trace-event document of a run folder."""
    scenario = yaml.safe_load((folder / "scenario.yaml").read_text())
    steps, requests = read_table(folder, "steps"), read_table(folder, "requests")
    labels = replica_labels(scenario)
    replicas = sorted({*steps["replica"].astype(int), *requests["replica"].dropna().astype(int)})
    meta = []
    for replica in replicas:
        pid = replica + 1
        meta += [
            {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": _label(labels, replica)}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": replica}},
        ]
    step_events = _step_events(steps)
    for pid, tid in sorted({(e["pid"], e["tid"]) for e in step_events if e["ph"] == "X"}):
        meta.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": f"steps {tid}"}}
        )
    events = meta + step_events + _request_events(requests)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"scenario": scenario.get("name", "")},
    }


def write_perfetto(folder: Path, out: Path) -> int:
    """Write the run folder's trace to `out` (atomically); returns the number of events."""
    folder = Path(folder)
    if not (folder / "summary.json").is_file() or not (folder / "scenario.yaml").is_file():
        raise SpecError(f"{folder}: not a run folder (no summary.json and scenario.yaml)")
    check_output_file(out, "--perfetto")
    try:
        document = trace_events(folder)
    except (FileNotFoundError, KeyError, yaml.YAMLError, pd.errors.ParserError) as err:
        raise SpecError(
            f"{folder}: an incomplete or damaged run folder ({type(err).__name__}: {err})"
        ) from None
    write_text_atomic(out, json.dumps(document, separators=(",", ":")))
    return len(document["traceEvents"])
