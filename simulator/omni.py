"""Multi-stage pipelines (vLLM-Omni): the `stages:` section of a scenario.

A request runs through the stages in order (e.g. thinker -> talker -> codec), each an engine with its
own model, GPU, parallelism and engine settings (`engine` overrides the scenario's). Stage 1 sees the
workload's prompt and output lengths; a later stage's prompt and output are the previous stage's
output tokens times `prompt_ratio` and `output_ratio` (at least 1 token each). When a stage finishes a
request, the tensors it hands on (`outputs`: per-token hidden states of the stage model's width by
default, shape [prompt + output tokens, D]) go device -> host -> device over the two stages' PCIe links,
and the next stage starts the request. simulator/world/omni_run.py runs it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from servesim.hardware.model import check_model_name
from servesim.hardware.spec_model import SpecModel


class OutputTensorConfig(SpecModel):
    """A per-token tensor a stage hands to the next one."""

    name: str = Field("hidden_states", description="Name (vLLM-Omni's output key)")
    dims: int | None = Field(None, ge=1, description="Values per token (None: the stage model's hidden size)")
    dtype: Literal["bf16", "fp16", "fp32", "int32", "int64"] = Field("bf16", description="Element type")


class StageConfig(SpecModel):
    """One stage of a pipeline: an engine (or several replicas) serving its own model."""

    name: str = Field(description="Stage name, e.g. thinker, talker, codec")
    model: str | None = Field(
        None, description="Model preset or config.json path (None: the scenario's model)"
    )
    gpu: str | None = Field(None, description="GPU name (None: the scenario's)")
    tp: int = Field(1, ge=1, description="Tensor-parallel GPUs per replica")
    replicas: int = Field(1, ge=1, description="Replicas of this stage")
    router: str = Field("round_robin", description="Routing policy across this stage's replicas")
    engine: dict[str, Any] = Field(
        default_factory=dict, description="Engine fields overriding the scenario's"
    )
    # bounded so a stage's lengths stay finite integers (a talker's codec emits tens of tokens per text token)
    prompt_ratio: float = Field(
        1.0, gt=0, le=1e6, description="Later stages: prompt tokens per output token of the previous stage"
    )
    output_ratio: float = Field(
        1.0, gt=0, le=1e6, description="Later stages: output tokens per output token of the previous stage"
    )
    outputs: list[OutputTensorConfig] = Field(
        default_factory=lambda: [OutputTensorConfig()],
        description=("Tensors handed to the next stage, one row per prompt + output token"),
    )
    cache_outputs: bool = Field(
        False,
        description=(
            "vLLM-Omni stage-output prefix cache: keep `outputs` in pinned host memory, one "
            "[num_blocks, block_size, dims] buffer each (reported in the memory plan)"
        ),
    )

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str | None) -> str | None:
        return value if value is None else check_model_name(value)


def stage_lengths(stage: StageConfig, prev_output_tokens: int) -> tuple[int, int]:
    """(prompt, output) tokens of a later stage for a request whose previous stage generated `prev_output_tokens`."""
    return (
        max(1, round(prev_output_tokens * stage.prompt_ratio)),
        max(1, round(prev_output_tokens * stage.output_ratio)),
    )
