"""The base of every input model (scenario sections, GPU and profile files, measured runs): frozen, unknown keys
refused, and a true/false where a number belongs refused too, which pydantic would otherwise read as 1/0
(`max_num_seqs: yes` would run one sequence at a time)."""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

NUMBER_TYPES = (int, float)
BOOL_FOR_NUMBER = "bool_for_number"  # the error type; its `field` context names the field inside the model


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        # a model validator, not a field one: pydantic allows no before-validator on a union's discriminator (kind)
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name) if isinstance(name, str) else None
                if isinstance(value, bool) and field is not None and numbers_only(field.annotation):
                    raise PydanticCustomError(BOOL_FOR_NUMBER, "{field}: expected a number, not {given}",
                                              {"field": name, "given": str(value).lower()})
        return data


def numbers_only(annotation: Any) -> bool:
    """Whether a field's type admits numbers (int, float) and None but nothing else, so a bool is a mistake."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return numbers_only(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return bool(args) and all(numbers_only(arg) for arg in args)
    return annotation in NUMBER_TYPES
