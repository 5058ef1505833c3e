"""Calibration profile: the efficiencies and overheads that turn roofline floors into predicted step times.

Without a fitted profile the cost model uses `Profile()` — documented defaults chosen from public
H100/H200 measurements (GEMMs reach ~70% of dense peak, weight streaming ~85% of HBM bandwidth,
FlashAttention ~55% of peak in prefill and ~80% of bandwidth in decode, NCCL ~70% of link rate,
~0.25 ms per step for scheduling, launch and sampling). `calibration/` fits these per device from the
executor's step times (`servesim calibrate`) or from measured benchmark runs' figures (`servesim fit`);
`servesim compare benchmarks/published_runs.yaml` shows how far a profile is from published measurements.
One profile may differ per GPU (`gpus:` sections, which `servesim fit --gpu` fits): the same kernels reach
different fractions of each GPU's peaks (a fused-MoE kernel on an A100 and on an H100), and a plan weighs GPUs
against each other with one profile. It may differ per engine too (`engines:` sections, `servesim fit --engine`):
engines run different kernels for the same operator (SGLang's block-FP8 fused MoE and vLLM's), and an engine's section
may hold GPU sections of its own (`engines: {sglang: {gpus: {mi300x: ...}}}`, `fit --engine E --gpu G`) for what
differs with both (an engine's kernels on one vendor's GPUs).
Bundled in calibration/profiles/: `vllm-published` (the defaults plus the per-layer gaps small-batch decodes
measure) and `published-fit` (fitted to the published runs, routed experts apart).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from servesim.hardware.errors import SpecError
from servesim.hardware.files import parse_yaml, read_text, read_yaml
from servesim.hardware.gpu import gpu_catalog
from servesim.hardware.kernel_tables import ENGINE, FRAMEWORKS, framework_for, split_kernels
from servesim.hardware.model import WEIGHT_DTYPE_BYTES
from servesim.hardware.spec_model import SpecModel

PROFILE_DIR = Path(__file__).parent.parent / "calibration" / "profiles"
#: A profile's fixed costs of a step's forward pass, seconds: per step, per layer, per request, per token of the step,
#: per layer attending decodes beside prefill chunks, per YOCO cross-decoder layer of a prefilling step and per token
#: each layer that owns KV writes (the host_* fields are the serving loop's, outside it).
FIXED_COSTS = (
    "step_overhead_s",
    "layer_overhead_s",
    "request_overhead_s",
    "token_overhead_s",
    "mixed_layer_overhead_s",
    "fast_prefill_layer_s",
    "kv_write_token_s",
)


class EfficiencyCurve(SpecModel):
    """Fraction of a roofline peak reached, as a function of tokens in the step.

    Points are (tokens, efficiency); between them efficiency is interpolated linearly in log(tokens)
    and held flat outside. A single number in YAML means a constant.
    """

    points: tuple[tuple[float, float], ...]

    @field_validator("points")
    @classmethod
    def _valid(cls, points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
        if not points:
            raise ValueError("needs at least one (tokens, efficiency) point")
        if any(not 0 < eff <= 1.0 or tokens < 1 for tokens, eff in points):
            raise ValueError("efficiencies must lie in (0, 1] and tokens be >= 1")
        return tuple(sorted(points))

    @classmethod
    def constant(cls, value: float) -> EfficiencyCurve:
        return cls(points=((1.0, value),))

    def at(self, tokens: float) -> float:
        pts = self.points
        if tokens <= pts[0][0] or len(pts) == 1:
            return pts[0][1]
        for (t0, e0), (t1, e1) in zip(pts, pts[1:]):
            if tokens <= t1:
                w = (math.log(tokens) - math.log(t0)) / (math.log(t1) - math.log(t0))
                return e0 + w * (e1 - e0)
        return pts[-1][1]


class FitRecord(SpecModel):
    """What some of a profile's numbers were fitted to: `fields`, from the figures of `runs` (labels of a measured-runs
    file, as `servesim compare` prints them). `servesim compare --split` counts a run as held out from a profile only
    where none of its records that price the run (MoE fields price MoE models only) drew on a run of the same
    source or GPU."""

    fields: tuple[str, ...] = Field(min_length=1)
    runs: tuple[str, ...] = Field(min_length=1)


#: The default routed-expert efficiencies were fitted (`servesim fit --only moe_compute,moe_memory`) to the MoE runs
#: among the two thirds of benchmarks/published_runs.yaml that fit held in (every third run held out).
DEFAULT_MOE_FIT = FitRecord(
    fields=("moe_compute", "moe_memory"),
    runs=(
        "gpt-oss-20b h100-sxm mxfp4 serve 128/4 all at once x1000",
        "gpt-oss-20b h100-sxm mxfp4 serve 2000/100 all at once x500",
        "gpt-oss-20b a100-80gb mxfp4 serve 128/4 all at once x1000",
        "gpt-oss-20b a100-80gb mxfp4 serve 2000/100 all at once x500",
        "gpt-oss-120b h100-sxm mxfp4 serve 229/217 c=4 x100",
        "gpt-oss-120b h100-sxm mxfp4 serve 128/4 all at once x1000",
        "deepseek-v3 h200 TP8 fp8 serve 4000/200 all at once x500",
        "deepseek-v3 h200 TP8 fp8 serve 32000/100 all at once x100",
        "deepseek-v3 h200 TP8 fp8 serve 1000/2000 10 req/s x50",
        "deepseek-v3 h200 TP8 fp8 serve 10000/500 10 req/s x50",
        "deepseek-v3 h200 TP8 fp8 serve 30000/100 10 req/s x50",
        "deepseek-v3 h200 TP8 fp8 serve 2000/100 all at once x500",
    ),
)
MOE_FIELDS = frozenset({"moe_compute", "moe_memory"})
#: What a `moe_kernels` entry may set: the routed experts' efficiencies and fixed costs, and whether tables price them.
MOE_KERNEL_FIELDS = ("moe_compute", "moe_memory", "moe_layer_s", "moe_expert_s", "moe_tables")
API_FIELDS = frozenset(
    {"api_request_s", "api_token_s", "api_latency_s"}
)  # price runs through an API server only


def _curve(value: object) -> object:
    return {"points": [[1.0, value]]} if isinstance(value, (int, float)) else value


class Profile(SpecModel):
    """Per-operator-class efficiencies and fixed overheads of one device/engine, with provenance."""

    name: str = "default"
    provenance: str = "servesim documented defaults (not fitted; routed experts fitted to published runs)"
    gemm_compute: EfficiencyCurve = EfficiencyCurve.constant(0.70)
    gemm_memory: EfficiencyCurve = EfficiencyCurve.constant(0.85)
    attn_compute: EfficiencyCurve = EfficiencyCurve.constant(0.55)
    attn_memory: EfficiencyCurve = EfficiencyCurve.constant(0.80)
    comm: EfficiencyCurve = EfficiencyCurve.constant(0.70)
    # Routed experts default to what 11 published MoE runs need, the other defaults held (servesim fit
    # benchmarks/published_runs.yaml --only moe_compute,moe_memory: gpt-oss on H100/A100, DeepSeek-R1 TP8 on H200,
    # vLLM 0.8-0.11; gpt-oss's experts counted padded as its mxfp4 kernels run them): fused-MoE kernels, with their
    # routing, permutation and launches, reach a fraction of a dense GEMM's speed; the GEMM curves (0.70, 0.85)
    # predicted these runs ~50% fast
    moe_compute: EfficiencyCurve | None = Field(
        EfficiencyCurve.constant(0.180),
        description=(
            "Routed-expert (fused-MoE) kernels' fraction of compute peak; None: the GEMM curve's (an executor fit, "
            "whose MoE runs on the same GEMMs)"
        ),
    )
    moe_memory: EfficiencyCurve | None = Field(
        EfficiencyCurve.constant(0.273),
        description=("Routed-expert kernels' fraction of HBM bandwidth; None: the GEMM curve's"),
    )
    moe_layer_s: float = Field(
        0.0,
        ge=0,
        description=(
            "Per MoE layer per step, on top of the routed experts' roofline: routing (top-k, sort), token "
            "permutation and the fused-MoE launches, which cost the same at TP 1 and TP 8"
        ),
    )
    moe_expert_s: float = Field(
        0.0,
        ge=0,
        description=(
            "Per routed expert a GPU's fused-MoE kernel runs per layer per step: its tiles' setup and first weight "
            "loads, which a small per-GPU slice of the expert does not amortize"
        ),
    )
    moe_tables: bool = Field(
        False,
        description=(
            "Price routed experts from the kernel tables where they hold the model's (as kernel_ops' moe does for "
            "every expert dtype): set in a moe_kernels entry, for one dtype's kernels on one engine and GPU"
        ),
    )
    moe_kernels: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=(
            "Per expert weight dtype (mxfp4, fp8, ...): the routed-expert numbers (moe_compute, moe_memory, "
            "moe_layer_s, moe_expert_s) that differ for that dtype's fused-MoE kernels, e.g. MXFP4 experts on "
            "Triton kernels next to block-FP8 ones; the rest as the profile's. An entry prices its experts over a "
            "GPU section's own moe_* numbers; a section's entry for the dtype replaces the shared one whole"
        ),
    )
    step_overhead_s: float = Field(2.5e-4, ge=0, description="Per step: scheduling, launch, sampling")
    layer_overhead_s: float = Field(
        0.0, ge=0, description="Per layer per step: launches not hidden by graphs"
    )
    request_overhead_s: float = Field(
        2e-6, ge=0, description="Per scheduled request per step: metadata, sampling"
    )
    eager_layer_s: float = Field(
        0.0,
        ge=0,
        description=(
            "Per layer of a step the engine runs outside CUDA graphs: the host's time to launch its kernels. The GPU "
            "cannot run them faster than they are launched, so such a step lasts the longer of its GPU time and this "
            "times the layers (a floor, not an addition: launches overlap the kernels they queue); 0: no floor"
        ),
    )
    token_overhead_s: float = Field(
        0.0,
        ge=0,
        description=(
            "Per token of the step outside the layers: positions, rotary tables, slot mapping, the embedding gather; "
            "`servesim calibrate` fits it (it shows where prefills are short)"
        ),
    )
    mixed_layer_overhead_s: float = Field(
        0.0,
        ge=0,
        description=(
            "Per layer that attends decodes beside prefill chunks in one step: the second attention path's launches "
            "(backends that split prefill and decode kernels, and the calibration executor); `servesim calibrate` "
            "fits it"
        ),
    )
    fast_prefill_layer_s: float = Field(
        0.0,
        ge=0,
        description=(
            "Per YOCO fast-prefill layer in a step that prefills with `kv_sharing_fast_prefill` on: the cross-decoder's "
            "own attention metadata and the decode attention path it runs beside the prefill layers' path; "
            "`servesim calibrate` fits it from steps timed with fast prefill on and off"
        ),
    )
    kv_write_token_s: float = Field(
        0.0,
        ge=0,
        description=(
            "Per token per layer that owns its KV: the key rotation and cache write, kernels of their own beside "
            "attention that KV-sharing layers skip; `servesim calibrate` fits it from steps timed with fast prefill "
            "on and off, whose ratio tells it from the GEMMs"
        ),
    )
    elementwise_kernels: float = Field(
        0.0,
        ge=0,
        description=(
            "Memory-bound elementwise kernels per layer outside the GEMMs and attention (residual add + RMSNorm twice, "
            "rotary embedding, the gated activation): priced as the hidden states, rotated heads and activations they "
            "move at the GEMM streaming efficiency plus `elementwise_latency_s` each; 0 leaves them out (the defaults' "
            "fixed overheads hold them)"
        ),
    )
    elementwise_latency_s: float = Field(
        3e-6,
        ge=0,
        description=(
            "Constant latency of one elementwise kernel: aiconfigurator's mem_empirical_constant_latency (3 us on "
            "A100/H100/H200/B200/L40S)"
        ),
    )
    host_step_s: float = Field(
        0.0,
        ge=0,
        description=(
            "Engine CPU time per step outside the forward pass (scheduling, input preparation, output "
            "processing), when it is not overlapped; `servesim calibrate` measures it on its serving loop"
        ),
    )
    host_request_s: float = Field(0.0, ge=0, description="The same, per scheduled request per step")
    api_request_s: float = Field(
        0.0,
        ge=0,
        le=1.0,
        description=(
            "API server time per request before the engine sees it (request parsing, input processing), one request "
            "at a time per engine (simulator/world/frontend.py); 0 with api_token_s and api_latency_s: requests reach the "
            "engine when sent"
        ),
    )
    api_token_s: float = Field(0.0, ge=0, le=1e-3, description="The same, per prompt token (tokenization)")
    api_latency_s: float = Field(
        0.0,
        ge=0,
        le=1.0,
        description=(
            "Per request, side by side with the others: network and IPC hops between client, API server and engine, "
            "and the first token's way back"
        ),
    )
    kernels: str | None = Field(
        None,
        description=(
            "Measured kernel tables that price GEMMs, attention and all-reduces instead of the roofline "
            "(hardware.kernel_tables, aiconfigurator-core's): engine (the scenario's scheduler's), vllm, sglang or "
            "trtllm, optionally @version; the other fields price what the tables lack"
        ),
    )
    kernel_ops: tuple[Literal["gemm", "attention", "all_reduce", "moe"], ...] = Field(
        ("gemm", "attention", "all_reduce"),
        description=(
            "Which operators `kernels` prices from the tables; moe (routed experts' fused kernels) is not by default: "
            "the tables' recent kernels predict the published vLLM 0.8-0.11 MoE runs 40-70% fast, where the fitted "
            "routed-expert efficiencies come within ~20%"
        ),
    )
    fits: tuple[FitRecord, ...] = Field(
        (DEFAULT_MOE_FIT,),
        description=(
            "The measured runs its numbers were fitted to (`servesim fit` records them), so compare can hold them out; "
            "unset: the default routed-expert fit while moe_compute/moe_memory keep their defaults"
        ),
    )
    fit_mape: float | None = Field(None, description="Mean absolute % error on held-out shapes, when fitted")
    gpus: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=(
            "Per-GPU sections: a GPU's catalog name -> the efficiencies and overheads that differ on it (the rest "
            "are the profile's); the cost model reads a GPU's section wherever it prices that GPU"
        ),
    )
    engines: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description=(
            "Per-engine sections: an engine's name (vllm, sglang, trtllm) -> the efficiencies and overheads that "
            "differ under it (its own kernels, e.g. a fused-MoE entry of moe_kernels); read wherever the scenario's "
            "engine is known, a GPU's section over it"
        ),
    )

    @field_validator(
        "gemm_compute",
        "gemm_memory",
        "attn_compute",
        "attn_memory",
        "comm",
        "moe_compute",
        "moe_memory",
        mode="before",
    )
    @classmethod
    def _number_is_constant(cls, value: object) -> object:
        return _curve(value)

    @model_validator(mode="after")
    def _own_moe_numbers_own_record(self) -> Profile:
        """A profile with routed-expert numbers of its own and no stated `fits` was not fitted as the defaults were."""
        defaults = type(self).model_fields
        if "fits" not in self.model_fields_set and any(
            getattr(self, name) != defaults[name].default for name in MOE_FIELDS
        ):
            object.__setattr__(self, "fits", ())
        return self

    @field_validator("moe_kernels")
    @classmethod
    def _moe_kernels_resolve(cls, kernels: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for dtype, values in kernels.items():
            if dtype not in WEIGHT_DTYPE_BYTES:
                raise ValueError(f"{dtype}: not a weight dtype; allowed: {', '.join(WEIGHT_DTYPE_BYTES)}")
            kernels[dtype] = cls._partial(dtype, values, MOE_KERNEL_FIELDS, "expert dtype", {})
        return kernels

    @classmethod
    def _partial(
        cls, where: str, values: dict[str, Any], allowed: tuple[str, ...], per: str, around: dict[str, Any]
    ) -> dict[str, Any]:
        """`values`, some of the `allowed` fields, validated over the fields `around` and kept as their fields dump,
        so equal entries compare equal; an error names `where` and the field."""
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ValueError(
                f"{where}: {', '.join(map(str, unknown))} cannot differ per {per}; allowed: {', '.join(allowed)}"
            )
        try:
            resolved = cls.model_validate(around | values)
        except ValidationError as err:
            first = err.errors()[0]
            location = ".".join([where, *map(str, first["loc"])])
            raise ValueError(f"{location}: {first['msg'].removeprefix('Value error, ')}") from None
        return {key: value for key, value in resolved.model_dump(mode="json").items() if key in values}

    @field_validator("kernels")
    @classmethod
    def _known_tables(cls, kernels: str | None) -> str | None:
        if kernels is not None:
            framework_for(kernels)
        return kernels

    @field_validator("gpus")
    @classmethod
    def _sections_resolve(
        cls, gpus: dict[str, dict[str, Any]], info: ValidationInfo
    ) -> dict[str, dict[str, Any]]:
        around = {k: v for k, v in info.data.items() if k in GPU_FIELDS}
        for gpu, section in gpus.items():
            gpus[gpu] = cls._partial(gpu, section, GPU_FIELDS, "GPU", around)
        return gpus  # each section as its fields dump, so a YAML round trip compares equal

    @field_validator("engines")
    @classmethod
    def _engine_sections_resolve(
        cls, engines: dict[str, dict[str, Any]], info: ValidationInfo
    ) -> dict[str, dict[str, Any]]:
        unknown = sorted(set(engines) - set(FRAMEWORKS))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not an engine; allowed: {', '.join(FRAMEWORKS)}")
        around = {k: v for k, v in info.data.items() if k in GPU_FIELDS}
        for engine, section in engines.items():
            nested = section.get("gpus", {})
            if not isinstance(nested, dict):
                raise ValueError(f"{engine}.gpus: a GPU's name -> its section, not {type(nested).__name__}")
            own = {key: value for key, value in section.items() if key != "gpus"}
            engines[engine] = cls._partial(engine, own, (*GPU_FIELDS, "gpus"), "engine", around)
            if nested:  # a GPU's numbers under this engine: over the engine's and the GPU's own
                engines[engine]["gpus"] = {
                    gpu: cls._partial(f"{engine}.gpus.{gpu}", values, GPU_FIELDS, "GPU", around)
                    for gpu, values in nested.items()
                }
        return engines

    def for_gpu(self, gpu: str) -> Profile:
        """The profile as it prices `gpu`: its section (if any) over the shared values, with no sections left, so
        a resolved profile passes through again for free."""
        return self._resolved("gpus", gpu)

    def _resolved(self, kind: str, name: str) -> Profile:
        """The profile with its `kind` section `name` (a GPU's, an engine's) over the shared values, no `kind`
        sections left."""
        sections = getattr(self, kind)
        if not sections:
            return self
        section = sections.get(name)
        if section is None:
            return self.model_copy(update={kind: {}})
        shared = self.model_dump(exclude={kind})
        section = dict(section)
        if "gpus" in section:  # an engine's GPU sections over the profile's own for those GPUs
            section["gpus"] = _over(shared["gpus"], section["gpus"])
        # the section's expert dtypes over the shared ones
        kernels = shared["moe_kernels"] | section.get("moe_kernels", {})
        return Profile.model_validate(shared | section | {"moe_kernels": kernels})

    def for_experts(self, dtype: str) -> Profile:
        """The profile as it prices routed experts of weight dtype `dtype`: its `moe_kernels` entry (if any) over
        the profile's numbers, with no entries left, so a resolved profile passes through again for free."""
        if not self.moe_kernels:
            return self
        values = self.moe_kernels.get(dtype, {})
        update = {k: _curve(v) if k in MOE_FIELDS else v for k, v in values.items()}
        return Profile.model_validate(self.model_dump() | update | {"moe_kernels": {}})

    def for_engine(self, engine_tables: str) -> Profile:
        """The profile as an engine runs whose kernels are `engine_tables`' (its family's `kernel_tables`): its
        section (if any) over the shared values, and `kernels: engine` naming them. A GPU's section still applies
        over it (`for_gpu`), with what the engine's section sets for that GPU (its `gpus:`) over the GPU's own."""
        profile = self._resolved("engines", engine_tables)
        if profile.kernels is None or split_kernels(profile.kernels)[0] != ENGINE:
            return profile
        version = split_kernels(profile.kernels)[1]
        return profile.model_copy(
            update={"kernels": framework_for(ENGINE, engine_tables) + (f"@{version}" if version else "")}
        )

    def with_section(self, kind: str, name: str, values: dict[str, Any], gpu: str | None = None) -> Profile:
        """This profile with `values` set in its `kind` (gpus, engines) section `name` (with `gpu`: in that section's
        own section for the GPU), over what it already held."""
        dumped = self.model_dump()
        sections = dumped[kind]
        section = sections.get(name, {})
        if gpu is not None:
            nested = section.get("gpus", {})
            values = {"gpus": nested | {gpu: nested.get(gpu, {}) | values}}
        return Profile.model_validate(dumped | {kind: sections | {name: section | values}})

    def curves(self, kind: str) -> tuple[EfficiencyCurve, EfficiencyCurve]:
        """(compute, memory) efficiency curves of an operator kind: gemm, attention or moe (GEMM's unless set)."""
        if kind == "attention":
            return self.attn_compute, self.attn_memory
        if kind == "moe":
            return self.moe_compute or self.gemm_compute, self.moe_memory or self.gemm_memory
        return self.gemm_compute, self.gemm_memory


def _over(gpus: dict[str, dict[str, Any]], more: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """GPU sections `more` over `gpus`: field by field, and a `moe_kernels` entry by expert dtype."""
    merged = dict(gpus)
    for gpu, values in more.items():
        kernels = merged.get(gpu, {}).get("moe_kernels", {}) | values.get("moe_kernels", {})
        merged[gpu] = merged.get(gpu, {}) | values | ({"moe_kernels": kernels} if kernels else {})
    return merged


#: What a `gpus:` or `engines:` section may set: the efficiencies and overheads, not a name, provenance, tables or fit
#: records.
GPU_FIELDS = tuple(
    name
    for name in Profile.model_fields
    if name not in ("name", "provenance", "kernels", "kernel_ops", "fits", "fit_mape", "gpus", "engines")
)


def best_validated_profile() -> str:
    """The bundled profile with the lowest held-out error recorded in it (`fit_mape`), or "default" when none
    records one: the profile a planner's answer is checked against."""
    scored = []
    for path in sorted(PROFILE_DIR.glob("*.yaml")):
        mape = read_yaml(path, "profile").get("fit_mape")
        if isinstance(mape, (int, float)):
            scored.append((mape, path.stem))
    return min(scored)[1] if scored else "default"


@functools.lru_cache(maxsize=16)
def _profile_of(path: Path, text: str) -> Profile:
    """The profile `path` holds (`text`), kept while the file reads the same: compare and fit replay hundreds of
    runs under one profile, and reading one anew costs tens of milliseconds. Profiles are frozen, so one is shared."""
    try:
        return Profile.model_validate(parse_yaml(text, path))
    except ValidationError as err:
        first = err.errors()[0]
        raise SpecError(
            f"{path}: {'.'.join(map(str, first['loc']))}: {first['msg'].removeprefix('Value error, ')}"
        ) from None


def load_profile(name_or_path: str | Path | None, gpu_files: tuple[Path, ...] = ()) -> Profile:
    """`None` -> defaults; a name -> calibration/profiles/<name>.yaml; otherwise a YAML path. Its `gpus:` sections
    must name GPUs of the catalog (with `gpu_files`): a misspelt one would silently price nothing."""
    if name_or_path is None or name_or_path == "default":
        return Profile()
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml")) if PROFILE_DIR.exists() else []
        raise SpecError(
            f"profile {str(name_or_path)!r} not found (looked for {path}); bundled: {known or 'none'}"
        )
    profile = _profile_of(path, read_text(path, "profile"))
    named = set(profile.gpus).union(*(section.get("gpus", {}) for section in profile.engines.values()))
    catalog = gpu_catalog(gpu_files) if named else {}
    unknown = sorted(named - set(catalog))
    if unknown:
        raise SpecError(
            f"{path}: gpus: {', '.join(unknown)} is not a GPU of the catalog; allowed: "
            f"{', '.join(sorted(catalog))}"
        )
    return profile
