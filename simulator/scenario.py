"""Scenario files: one YAML file describes the hardware, model, engine, policies, workload, SLOs and seed.

Loading never evaluates anything (the safe YAML loader only); every error names the file, the field path
and, for choices, the allowed values. `--set a.b=c` overrides are applied before validation.
"""

from __future__ import annotations

import copy

import difflib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator

from servesim.hardware.cost import Parallelism
from servesim.hardware.errors import SpecError, choices
from servesim.hardware.files import read_yaml
from servesim.hardware.gpu import get_gpu
from servesim.hardware.hf_models import snapshot_config
from servesim.hardware.model import check_model_name, get_model, is_config_path
from servesim.hardware.spec_model import BOOL_FOR_NUMBER, MAX_PARALLEL, MAX_REPLICAS, SpecModel
from servesim.policies.config import EngineConfig
from servesim.policies.app_cache import AppCacheConfig
from servesim.policies.catalog import orderings, routers, schedulers
from servesim.policies.families import family_of, known_family
from servesim.simulator.disagg_config import DisaggregationConfig, known_link
from servesim.simulator.omni import StageConfig
from servesim.workloads.config import TraceSource, WorkloadConfig


class HardwareConfig(SpecModel):
    gpu_files: list[Path] = Field(default_factory=list, description="Extra GPU catalog YAML files")
    gpu: str = Field(description="GPU name from the catalog (`servesim hardware list`) or a --gpu-file entry")
    profile: str | None = Field(
        None, description="Calibration profile name or YAML path; default: documented defaults"
    )

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, gpu: str, info: ValidationInfo) -> str:
        if not info.data.get("gpu_files"):  # with user files the lookup waits until paths are resolved
            get_gpu(gpu)
        return gpu


class ParallelismConfig(SpecModel):
    tp: int = Field(1, ge=1, le=MAX_PARALLEL, description="Tensor-parallel GPUs per replica")
    pp: int = Field(
        1, ge=1, le=MAX_PARALLEL, description="Pipeline stages per replica (as many micro-batches in flight)"
    )
    ep: bool = Field(
        False, description="MoE: experts spread whole over the TP group, tokens sent by all-to-all"
    )
    dp_attention: bool = Field(
        False,
        description=(
            "Attention data-parallel in the TP group (for MLA): vLLM's data-parallel ranks at TP 1 (all but the routed "
            "experts whole on each GPU), or under the sglang scheduler SGLang's DP attention (dense layers sliced)"
        ),
    )
    inter_node_link: str = Field("ib-ndr-400", description="Link between nodes when tp x pp exceeds a node")

    @field_validator("inter_node_link")
    @classmethod
    def _known_link(cls, value: str) -> str:
        return known_link(value)

    def spec(self, scheduler: str) -> Parallelism:
        """The layout `scheduler`'s engine runs: DP attention is vLLM's data-parallel ranks but under SGLang's."""
        return Parallelism(
            self.tp,
            self.pp,
            self.ep,
            self.dp_attention,
            self.inter_node_link,
            dense_replicated=self.dp_attention
            and self.tp > 1
            and not family_of(scheduler).dp_attention_slices_dense,
        )


class ClusterConfig(SpecModel):
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="Identical engine replicas (data parallel)")
    router: str = Field("round_robin", description="Routing policy across replicas")


class SloConfig(SpecModel):
    """Latency targets in milliseconds; a completed request meeting all of them counts toward goodput.

    Capacity search and the planner (simulator/planning/capacity.py) read them as percentile targets: the
    `percentile`-th TTFT, TPOT and E2EL over requests must be within the limits, and at least
    `goodput_fraction` of all requests must meet every limit.
    """

    ttft_ms: float | None = Field(None, gt=0, description="Time to first token limit, ms")
    tpot_ms: float | None = Field(
        None, gt=0, description="Time per output token limit (first token excluded), ms"
    )
    e2el_ms: float | None = Field(None, gt=0, description="End-to-end latency limit, ms")
    percentile: Literal[50, 90, 99] = Field(
        90, description="Percentile of TTFT/TPOT/E2EL that must meet the limits"
    )
    goodput_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description=("Minimum share of all requests (rejected ones included) meeting every limit"),
    )

    def as_ms(self) -> dict[str, float]:
        """The per-request limits given, keyed ttft / tpot / e2el (ms)."""
        limits = {"ttft": self.ttft_ms, "tpot": self.tpot_ms, "e2el": self.e2el_ms}
        return {k: v for k, v in limits.items() if v is not None}


class StopConfig(SpecModel):
    max_sim_time_s: float | None = Field(None, gt=0, description="Stop the simulation at this simulated time")


class SimulationConfig(SpecModel):
    fast_forward: bool = Field(
        True,
        description="Fuse decode stretches and chunked prefills beside decodes (results identical to stepping)",
    )
    compiled: bool = Field(
        True,
        description=(
            "Run a lone vLLM-style replica's loop compiled (numba) where the scenario allows it "
            "(simulator/world/compiled_run.py; results identical to the SimPy engine)"
        ),
    )


GridValues = Annotated[list[Any], Field(min_length=1)]
STUDY_SECTIONS = ("sweep", "plan")  # sections that describe studies of a scenario, not the run itself


class SweepConfig(SpecModel):
    """A grid of runs of this scenario: every combination of the values, one run each (`servesim sweep`)."""

    grid: dict[str, GridValues] = Field(
        default_factory=dict,
        description=(
            "Dotted scenario field -> values, e.g. {engine.max_num_seqs: [64, 128], "
            "workload.arrivals.rate_per_s: [5, 10]}"
        ),
    )


ParallelSize = Annotated[int, Field(ge=1, le=MAX_PARALLEL)]
ReplicaCount = Annotated[int, Field(ge=1, le=MAX_REPLICAS)]
# parallelism fields `servesim plan` may vary, in the candidates' order
LAYOUT_FIELDS = (
    "ep",
    "dp_attention",
)


class PlanConfig(SpecModel):
    """The deployments `servesim plan` compares: GPU type x TP x PP x layout x engine knobs, sized in replicas."""

    gpus: list[str] | None = Field(None, description="GPU names to consider; default: the scenario's GPU")
    tp: list[ParallelSize] = Field(
        [1, 2, 4, 8], min_length=1, description="Tensor-parallel sizes to consider"
    )
    pp: list[ParallelSize] | None = Field(
        None,
        min_length=1,
        description=(
            "Pipeline-parallel sizes to consider (stages of tp GPUs each); default: the scenario's parallelism.pp"
        ),
    )
    max_replicas: int = Field(
        16, ge=1, le=MAX_REPLICAS, description="Largest replica count of a recommendation"
    )
    engine: dict[str, GridValues] = Field(
        default_factory=dict,
        description=(
            "Engine field -> values to try, e.g. {max_num_seqs: [128, 256], max_num_batched_tokens: [2048, 8192]}"
        ),
    )
    target_rate_per_s: float | None = Field(
        None, gt=0, description=("Load to sustain, requests/s; default: the workload's arrival rate")
    )
    ep: list[bool] | None = Field(
        None,
        min_length=1,
        description=(
            "Expert parallel off and/or on, e.g. [false, true]; default: the scenario's parallelism.ep"
        ),
    )
    dp_attention: list[bool] | None = Field(
        None,
        min_length=1,
        description=(
            "DP attention off and/or on, e.g. [false, true]; default: the scenario's parallelism.dp_attention"
        ),
    )
    pd_ratios: list[tuple[ReplicaCount, ReplicaCount]] = Field(
        default_factory=list,
        description=(
            "Prefill/decode disaggregated units to consider as [prefill, decode] replica counts (xPyD), "
            "e.g. [[1, 1], [1, 2]]; empty: colocated deployments only"
        ),
    )

    @field_validator("engine")
    @classmethod
    def _engine_fields(cls, engine: dict[str, list[Any]]) -> dict[str, list[Any]]:
        unknown = sorted(set(engine) - set(EngineConfig.model_fields))
        if unknown:
            raise ValueError(
                f"unknown engine field {unknown[0]!r}; fields: {', '.join(EngineConfig.model_fields)}"
            )
        return engine

    def layouts(self) -> dict[str, list[bool]]:
        """The parallelism layouts to try: field -> values, for those the section sets."""
        return {name: getattr(self, name) for name in LAYOUT_FIELDS if getattr(self, name) is not None}


class Scenario(SpecModel):
    """A whole run. `model` is a preset name or a path to a Hugging Face config.json."""

    name: str = Field(
        "scenario",
        description=(
            "Names the default output folder runs/<name>: letters, digits, _ . + - (no path separators)"
        ),
    )
    seed: int = Field(0, ge=0, description="Seeds every random choice of the run")
    note: str | None = Field(
        None,
        max_length=500,
        description="Printed with the run's results: what the scenario shows, e.g. that it is overloaded on purpose",
    )
    model: str
    hardware: HardwareConfig
    parallelism: ParallelismConfig = ParallelismConfig()
    cluster: ClusterConfig = ClusterConfig()
    engine: EngineConfig = EngineConfig()
    workload: WorkloadConfig
    slo: SloConfig = SloConfig()
    stop: StopConfig = StopConfig()
    simulation: SimulationConfig = SimulationConfig()
    app_cache: AppCacheConfig = AppCacheConfig()
    sweep: SweepConfig | None = Field(None, description="Grid of runs for `servesim sweep`")
    plan: PlanConfig | None = Field(None, description="Deployments `servesim plan` compares")
    disaggregation: DisaggregationConfig | None = Field(None, description="Separate prefill and decode pools")
    stages: list[StageConfig] | None = Field(
        None,
        min_length=1,
        description=(
            "Multi-stage pipeline (vLLM-Omni): one engine per stage, run in order (simulator/omni.py)"
        ),
    )

    @model_validator(mode="after")
    def _pools_valid(self) -> Scenario:
        d = self.disaggregation
        if d is None:
            return self
        if self.cluster.replicas != 1:
            raise ValueError(
                "cluster.replicas: with disaggregation, set replicas per pool "
                "(disaggregation.prefill.replicas, disaggregation.decode.replicas)"
            )
        for name, pool in (("prefill", d.prefill), ("decode", d.decode)):
            scheduler = pool.engine.get("scheduler", self.engine.scheduler)
            family = known_family(scheduler) if isinstance(scheduler, str) else None
            if family is None or family.pd_pools is None:
                where = f"disaggregation.{name}.engine" if "scheduler" in pool.engine else "engine"
                raise ValueError(
                    f"{where}.scheduler {scheduler!r}: prefill and decode pools run vLLM's P/D "
                    "schedulers (allowed with disaggregation: vllm)"
                )
            try:
                routers.get(pool.router)
            except SpecError as err:
                raise ValueError(f"disaggregation.{name}.router: {err}") from None
            # with user files: once paths are resolved
            if pool.gpu is not None and not self.hardware.gpu_files:
                try:
                    get_gpu(pool.gpu)
                except SpecError as err:
                    raise ValueError(f"disaggregation.{name}.gpu: {err}") from None
            self._check_engine_overrides(pool.engine, f"disaggregation.{name}.engine")
        return self

    @model_validator(mode="after")
    def _batch_waiting_without_dp_attention(self) -> Scenario:
        if self.engine.batch_waiting and self.parallelism.dp_attention:
            raise ValueError(
                "engine.batch_wait_timeout_iters/batch_wait_max_tokens_ratio: TensorRT-LLM waits to batch only "
                "without attention DP (parallelism.dp_attention); leave them at 0 or turn DP attention off"
            )
        return self

    @model_validator(mode="after")
    def _recv_interval_without_dp_attention_or_pp(self) -> Scenario:
        if self.engine.scheduler_recv_interval > 1 and self.parallelism.dp_attention:
            raise ValueError(
                "engine.scheduler_recv_interval: SGLang 0.5 refuses --scheduler-recv-interval under DP attention "
                "(parallelism.dp_attention); leave it at 1 or turn DP attention off"
            )
        if self.engine.scheduler_recv_interval > 1 and self.parallelism.pp > 1:
            raise ValueError(
                "engine.scheduler_recv_interval with pipeline parallelism (parallelism.pp > 1) is not modelled: "
                "SGLang's micro-batches read into one queue, which the simulator's per-micro-batch engines do not "
                "share; leave it at 1"
            )
        return self

    @model_validator(mode="after")
    def _stage_engines_valid(self) -> Scenario:
        for i, stage in enumerate(self.stages or ()):
            self._check_engine_overrides(stage.engine, f"stages.{i}.engine")
        return self

    def engine_with(self, overrides: dict[str, Any]) -> EngineConfig:
        """The scenario's engine with a pool's or stage's `overrides`; fields unset in both stay unset, so the pool
        or stage resolves them for its own GPU and model. Raises pydantic's ValidationError."""
        return EngineConfig.model_validate({**self.engine.model_dump(exclude_unset=True), **overrides})

    def _check_engine_overrides(self, overrides: dict[str, Any], where: str) -> None:
        """A pool's or stage's engine, checked here, at load, with its place."""
        try:
            self.engine_with(overrides)
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join([where, *(str(p) for p in first["loc"])])
            raise ValueError(f"{field}: {first['msg'].removeprefix('Value error, ')}") from None

    @field_validator("name")
    @classmethod
    def _folder_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}", value):
            raise ValueError(
                f"{value!r} names the output folder runs/<name>: use letters, digits and _ . + - "
                "(first a letter, digit or _; 128 at most)"
            )
        return value

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        return check_model_name(value)

    @field_validator("engine")
    @classmethod
    def _known_policies(cls, engine: EngineConfig) -> EngineConfig:
        scheduler = schedulers.get(engine.scheduler)
        orderings.get(engine.queue_order)
        if engine.prefix_caching != "none" and not scheduler.supports_prefix_caching:
            raise ValueError(
                f"scheduler {engine.scheduler!r} does not share KV blocks; set prefix_caching: none "
                "(allowed with it: none)"
            )
        if engine.queue_order == "lpm" and engine.prefix_caching == "none":
            raise ValueError(
                "queue_order 'lpm' sorts by cached prefix; it needs prefix_caching vllm or radix"
            )
        return engine

    @field_validator("cluster")
    @classmethod
    def _known_router(cls, cluster: ClusterConfig) -> ClusterConfig:
        routers.get(cluster.router)
        return cluster

    @model_validator(mode="after")
    def _sweep_keys_exist(self) -> Scenario:
        if self.sweep is not None:
            check_grid_keys(self, self.sweep.grid)
        return self

    def with_engine_defaults(self) -> Scenario:
        """This scenario with the engine's unset batch limits filled in as vLLM would for its GPU and model
        (policies.config.EngineConfig.with_defaults); a pool or stage resolves its own."""
        gpu = get_gpu(self.hardware.gpu, tuple(self.hardware.gpu_files))
        model = get_model(self.model)
        max_len = self.engine.max_model_len or model.max_position_embeddings
        par = self.parallelism
        engine = self.engine.with_defaults(
            gpu, max_len, par.tp, par.pp, par.dp_attention, model.mla is not None, model.architecture
        )
        return self if engine is self.engine else self.model_copy(update={"engine": engine})

    def run_settings(self) -> Scenario:
        """This scenario without its study sections (sweep, plan): what one run depends on."""
        return self.model_copy(update=dict.fromkeys(STUDY_SECTIONS))


def check_grid_keys(base: Scenario, grid: dict[str, list[Any]]) -> None:
    """Raise ValueError unless every dotted key of `grid` names a field of `base` (checked by applying
    the key's first value and validating). Values are checked per grid point, where they combine."""
    for key in grid:
        if key.split(".")[0] in STUDY_SECTIONS:
            raise ValueError(
                f"sweep grid key {key!r}: a grid varies run settings, not the {key.split('.')[0]} section"
            )
        try:
            with_overrides(base.run_settings(), {key: grid[key][0]})
        except SpecError as err:  # a parent of the key is a value, not a section
            reason = str(err).split(": ", 1)[-1]
            raise ValueError(f"sweep grid key {key!r} is not a scenario field ({reason})") from None
        except ValidationError as err:
            unknown = [e for e in err.errors() if e["type"] == "extra_forbidden"]
            if unknown:
                loc, fields = _user_path(Scenario, [str(p) for p in unknown[0]["loc"]])
                close = difflib.get_close_matches(loc[-1], fields or [], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(
                    f"sweep grid key {key!r} is not a scenario field ({'.'.join(loc)}: unknown field{hint})"
                ) from None


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides; values are parsed as YAML scalars (numbers, booleans, lists).
    A key set twice is an error, as in a scenario file: which one was meant cannot be known."""
    seen: set[str] = set()
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SpecError(f"--set {item!r}: expected dotted.key=value")
        if key in seen:
            raise SpecError(f"--set {item!r}: {key} is set twice")
        seen.add(key)
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise SpecError(
                f"--set {item!r}: the value is not valid YAML ({str(err).splitlines()[0]})"
            ) from None
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SpecError(f"--set {item!r}: {part!r} is not a section")
        node[leaf] = value
    return raw


def with_overrides(base: Scenario, overrides: dict[str, Any]) -> Scenario:
    """`base` with dotted-key overrides (typed values), validated again; raises SpecError or ValidationError.

    Starts from the fields `base` was given (not its defaults), as a scenario file would.
    """
    raw = base.model_dump(mode="json", exclude_unset=True)
    apply_overrides(raw, [f"{key}={json.dumps(value)}" for key, value in overrides.items()])
    return Scenario.model_validate(raw)


def first_error(
    err: ValidationError, source: str, model: type[BaseModel] | None = None, overrides: list[str] = ()
) -> SpecError:
    """The first problem of `err` (an unknown field first) as one line naming `source`, the field and, for choices,
    the value given.
    With the validated `model`, an unknown field also gets the nearest known name and the fields allowed
    there, union tags pydantic puts in the path (`arrivals.poisson.rate_per_s`) are left out, and a problem
    at (or under) one of the `--set` `overrides` is said to come from it."""
    errors = err.errors()
    # a misspelled section is both an unknown field and a missing one: name the spelling, which says more
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [str(p) for p in first["loc"]]
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == BOOL_FOR_NUMBER:  # raised by the model around the field: point at the field
        loc.append(first["ctx"]["field"])
        message = message.removeprefix(f"{first['ctx']['field']}: ")
    fields: list[str] | None = None
    if model is not None:
        loc, fields = _user_path(model, loc)
    if any(loc[: len(key)] == key for key in (o.partition("=")[0].split(".") for o in overrides)):
        source = f"{source} (from --set)"
    if first["type"] == "extra_forbidden":
        message = "unknown field"
        if fields:
            close = difflib.get_close_matches(loc[-1], fields, n=1)
            listed = ", ".join(fields)
            if close and len(listed) > 80:  # the nearest is named: say where the rest are
                message += f"; did you mean {close[0]!r}? ({len(fields)} fields here: servesim schema)"
            else:
                message += (
                    f"; did you mean {close[0]!r}?" if close else ""
                ) + f" (fields here: {choices(fields, loc[-1], 'servesim schema', width=80)})"
    elif first["type"] == "union_tag_invalid":  # pydantic's sentence quotes every tag and the key's name too
        tags = first["ctx"]["expected_tags"].replace("'", "")
        message = f"unknown {first['ctx']['discriminator'].strip(chr(39))} {first['ctx']['tag']!r}; choose from {tags}"
    elif first["type"] == "literal_error":  # pydantic's sentence quotes every allowed value: the nearest few
        allowed = re.findall(r"'([^']*)'", first["ctx"]["expected"])
        message = f"{first['input']!r} is not one of {choices(allowed, first['input'], width=90)}"
    path = ".".join(loc)
    return SpecError(f"{source}: {path}: {message}" if path else f"{source}: {message}")


def _user_path(model: type[BaseModel], loc: list[str]) -> tuple[list[str], list[str] | None]:
    """`loc` without the union tags pydantic adds, and the field names of the model its last part sits in."""
    shown, current = [], model
    for i, part in enumerate(loc):
        models = _models_in(current)
        tagged = [m for m in models if part in _tags(m)]
        if tagged and i > 0:  # a discriminated union's tag: pick that member, show nothing
            current = tagged[0]
            continue
        shown.append(part)
        owner = next((m for m in models if part in m.model_fields), None)
        if owner is None:
            return shown + loc[i + 1 :], sorted(models[0].model_fields) if len(models) == 1 else None
        current = owner.model_fields[part].annotation
    return shown, None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold (through Optional, unions, Annotated, lists, dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _tags(model: type[BaseModel]) -> tuple[str, ...]:
    """The `kind` literal values that name `model` in a discriminated union."""
    kind = model.model_fields.get("kind")
    return tuple(str(v) for v in get_args(kind.annotation)) if kind is not None else ()


def load_scenario(path: Path, overrides: list[str] = (), seed: int | None = None) -> tuple[Scenario, Path]:
    """Read, override and validate a scenario file. Returns it with the folder relative paths resolve against."""
    path = Path(path)
    raw = read_yaml(path, "scenario file")
    if not isinstance(raw, dict):
        raise SpecError(
            f"{path}: a scenario is a mapping of sections (model, hardware, engine, workload, ...)"
        )
    raw = apply_overrides(_files_beside(raw, path.parent), list(overrides))
    if seed is not None:
        raw["seed"] = seed
    try:
        scenario = Scenario.model_validate(raw)
    except ValidationError as err:
        raise first_error(err, str(path), Scenario, list(overrides)) from None
    return scenario, path.parent


def _files_beside(raw: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`raw` (a scenario file as read) with its relative GPU files, profile and model config.json paths made
    relative to `folder`, the file's own, as its traces are; `--set` values, applied after, stay relative to the
    working folder."""

    def beside(section: Any, key: str, is_path) -> None:
        value = section.get(key) if isinstance(section, dict) else None
        if isinstance(value, str) and is_path(value) and not Path(value).is_absolute():
            section[key] = str(folder / value)

    raw = copy.deepcopy(raw)
    hardware, engine = raw.get("hardware"), raw.get("engine")
    if isinstance(hardware, dict) and isinstance(hardware.get("gpu_files"), list):
        hardware["gpu_files"] = [
            str(folder / f) if isinstance(f, str) and not Path(f).is_absolute() else f
            for f in hardware["gpu_files"]
        ]
    beside(hardware, "profile", lambda value: bool(Path(value).suffix))  # a YAML path, not a bundled name

    def local(value: str) -> bool:  # a config.json, or a model folder beside the scenario holding one
        return is_config_path(value) or snapshot_config(folder / value) is not None

    beside(raw, "model", local)
    beside(engine.get("speculative") if isinstance(engine, dict) else None, "draft_model", local)
    stages = raw.get("stages")
    for stage in stages if isinstance(stages, list) else ():  # anything else is refused when validated
        beside(stage, "model", local)
    return raw


def trace_sources(model: Any) -> list[TraceSource]:
    """Every trace `model` (a scenario or a part of one) reads: the workload's, an empirical length
    distribution's, a stage's."""
    found: list[TraceSource] = []
    _rebuilt(model, lambda part: found.append(part) or part if isinstance(part, TraceSource) else part)
    return found


def with_absolute_paths(model: Any, base_dir: Path) -> Any:
    """`model` with its relative paths made absolute: traces against `base_dir` (the scenario file's folder);
    GPU files, profiles and model config.json files against the working folder (where they were read), so the
    resolved scenario a run writes into its own folder reruns from there. Runs themselves keep the paths as
    given: a sweep point's hash does not depend on where the project sits."""

    def absolute(part: BaseModel) -> BaseModel:
        if isinstance(part, TraceSource):
            return (
                part
                if part.path.is_absolute()
                else part.model_copy(update={"path": (base_dir / part.path).absolute()})
            )
        update = {}
        if isinstance(part, HardwareConfig):
            update["gpu_files"] = [f.absolute() for f in part.gpu_files]
            if part.profile is not None and Path(part.profile).suffix:  # a YAML path, not a bundled name
                update["profile"] = str(Path(part.profile).absolute())
        for name in ("model", "draft_model"):  # a config.json path, not a preset
            value = getattr(part, name) if name in type(part).model_fields else None
            if isinstance(value, str) and is_config_path(value):
                update[name] = str(Path(value).absolute())
        changed = {name: value for name, value in update.items() if value != getattr(part, name)}
        return part.model_copy(update=changed) if changed else part

    return _rebuilt(model, absolute)


def _rebuilt(model: Any, fix: Callable[[BaseModel], BaseModel]) -> Any:
    """`model` (a pydantic model, or lists and dicts of them) with `fix` applied to every pydantic model in it,
    innermost first; what `fix` leaves as it is stays the same object."""
    if isinstance(model, (list, tuple)):
        return type(model)(_rebuilt(item, fix) for item in model)
    if isinstance(model, dict):
        return {key: _rebuilt(value, fix) for key, value in model.items()}
    if not isinstance(model, BaseModel):
        return model
    update = {name: _rebuilt(getattr(model, name), fix) for name in type(model).model_fields}
    changed = {name: value for name, value in update.items() if value is not getattr(model, name)}
    return fix(model.model_copy(update=changed) if changed else model)
