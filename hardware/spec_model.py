"""The base of every input model (scenario sections, GPU and profile files, measured runs): frozen, unknown keys
refused, and a true/false where a number belongs refused too, which pydantic would otherwise read as 1/0
(`max_num_seqs: yes` would run one sequence at a time)."""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

NUMBER_TYPES = (int, float)
BOOL_FOR_NUMBER = "bool_for_number"  # the error type; its `field` context names the field inside the model
MAX_REPLICAS = (
    4096  # each simulated replica keeps its KV pool's bookkeeping in memory: a million would not fit
)
MAX_PARALLEL = (
    1024  # GPUs in one tensor- or pipeline-parallel group: past any NVLink domain built or announced
)
#: The most tokens (or seconds) any count may name: far beyond any context, and within int64 however it is summed.
MAX_TOKENS = 1 << 40


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # no NaN or inf reaches numpy

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        # a model validator, not a field one: pydantic allows no before-validator on a union's discriminator (kind)
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name) if isinstance(name, str) else None
                if field is not None and bool_for_a_number(field.annotation, value):
                    raise PydanticCustomError(
                        BOOL_FOR_NUMBER, "{field}: expected a number, not a true/false", {"field": name}
                    )
        return data


def bool_for_a_number(annotation: Any, value: Any) -> bool:
    """Whether `value`, or an item of it, is a bool where `annotation` admits a number but no bool (a plain number
    field, `float | SomeModel`, `list[int]`, `dict[str, float]`, `tuple[tuple[float, float], ...]`)."""
    if isinstance(value, bool):
        return _admits_number(annotation) and not _admits_bool(annotation)
    if isinstance(value, (list, tuple, dict)):
        return any(_item_bools(arg, value) for arg in _members(annotation))
    return False


def _item_bools(annotation: Any, value: list | tuple | dict) -> bool:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(value, dict):
        return (
            origin is dict and len(args) == 2 and any(bool_for_a_number(args[1], v) for v in value.values())
        )
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return any(bool_for_a_number(args[0], item) for item in value)
    if origin is tuple and len(args) == len(value):
        return any(bool_for_a_number(arg, item) for arg, item in zip(args, value))
    return False


def _members(annotation: Any) -> list[Any]:
    """The types a field's annotation admits: a union's members, Annotated and Optional unwrapped."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _members(arg) if m is not type(None)]
    return [annotation]


def _admits_number(annotation: Any) -> bool:
    return any(member in NUMBER_TYPES for member in _members(annotation))


def _admits_bool(annotation: Any) -> bool:
    return any(
        member in (bool, Any)
        or (
            typing.get_origin(member) is Literal and any(isinstance(v, bool) for v in typing.get_args(member))
        )
        for member in _members(annotation)
    )
