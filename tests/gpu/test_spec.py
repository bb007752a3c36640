"""gpu/spec.py: the vocabulary the kinds declare their parameters in. A spec class validates a
Python call and a JSON request the same strict way, raising ParamError named as the
request spells the field; its JSON schema has no dangling references."""

from __future__ import annotations

import json
from dataclasses import KW_ONLY
from typing import Literal

import pytest
from pydantic import Field

from gpu.errors import ParamError
from gpu.spec import NotJson, check_int, from_json, json_schema, spec


@spec
class Inner:
    kind: Literal["a", "b"] = "a"
    size: int = Field(default=1, ge=1, le=10, description="how many")

    def __post_init__(self) -> None:
        if self.kind == "b" and self.size > 5:
            raise ParamError("size", "b takes at most 5", "too_big_for_b")


@spec
class Outer:
    """An outer spec."""

    __schema_extra__ = {"examples": [{"inner": {"kind": "a"}}]}

    scale: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    _: KW_ONLY
    inner: Inner
    items: list[int | str] = Field(default_factory=list)


def test_a_python_call_is_validated_and_frozen():
    outer = Outer(inner=Inner(size=3), scale=2)  # an int is a fine float
    assert outer.scale == 2.0 and outer.inner.size == 3
    with pytest.raises(AttributeError):
        outer.scale = 3.0  # type: ignore[misc]
    for bad, field in [
        ({"size": 0}, "size"),
        ({"size": True}, "size"),
        ({"kind": "c"}, "kind"),
        ({"size": 2.0}, "size"),
    ]:
        with pytest.raises(ParamError) as caught:
            Inner(**bad)
        assert caught.value.field == field and caught.value.code == "invalid_parameter"


def test_a_post_init_error_keeps_its_code_and_gets_the_path_of_its_spec():
    with pytest.raises(ParamError) as caught:
        Inner(kind="b", size=6)
    assert (caught.value.field, caught.value.code) == ("size", "too_big_for_b")
    with pytest.raises(ParamError) as caught:
        from_json(Outer, json.dumps({"inner": {"kind": "b", "size": 6}}))
    assert (caught.value.field, caught.value.code) == ("inner.size", "too_big_for_b")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"inner": {"size": True}}, "inner.size"),  # true is no number
        ({"inner": {"size": 2.0}}, "inner.size"),  # 2.0 is no count
        ({"inner": {}, "scale": "1"}, "scale"),  # nor is "1"
        ({"inner": {}, "scale": 0}, "scale"),
        ({"inner": {}, "extra": 1}, "extra"),  # an unknown option
        ({}, "inner"),  # a missing one
        ({"inner": {}, "items": [1, 2.5]}, "items[1]"),  # a union's member tags are not the client's words
    ],
)
def test_a_json_request_is_read_strictly_and_errors_name_the_field(body, field):
    with pytest.raises(ParamError) as caught:
        from_json(Outer, json.dumps(body))
    assert caught.value.field == field, str(caught.value)
    assert str(caught.value).startswith(f"{field}: ")


def test_not_json_is_its_own_error():
    with pytest.raises(NotJson, match="the body is not JSON"):
        from_json(Outer, b"{'inner': ")
    with pytest.raises(NotJson, match="the field 'params' is not JSON"):
        from_json(Outer, b"[", "params.")


def test_the_schema_is_written_in_place_with_its_extras():
    schema = json_schema(Outer)
    assert "$ref" not in json.dumps(schema) and "$defs" not in schema
    assert schema["properties"]["inner"]["properties"]["size"]["maximum"] == 10
    assert schema["required"] == ["inner"] and schema["additionalProperties"] is False
    assert schema["examples"] == [{"inner": {"kind": "a"}}]
    schema["properties"].clear()
    assert json_schema(Outer)["properties"]  # every call a fresh copy


def test_check_int():
    assert check_int("n", 3, 1, 5) == 3
    for bad in (0, 6, True, 2.0, "3"):
        with pytest.raises(ParamError) as caught:
            check_int("n", bad, 1, 5)
        assert caught.value.field == "n"
