"""The vocabulary every job kind declares its parameters in, once.

A kind's parameters are a `@spec` class in gpu/<kind>/params.py: a frozen pydantic
dataclass whose fields carry their type, default, bounds and a help sentence. The same
class validates a Python call (`SvdParams(method="lapack")`, raising ParamError), a JSON
request (`from_json`, strict: true is no number, 2.0 no count) and gives the OpenAPI
schema (`json_schema`), so a bound changes in one place. Cross-field rules go in the
class's `__post_init__`, which raises ParamError.

`Result` is the base of the kinds' result schemas (every key of a summary declared);
`InputFile` and `JobSpec` say what a kind takes and gives, for the HTTP layer to derive
its forms and docs from.
"""

from __future__ import annotations

import copy
import functools
import json
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass

from gpu.errors import ParamError

T = TypeVar("T")

# strict: JSON's true is no number and 2.0 no count; extra: an unknown option is an error
SPEC_CONFIG = ConfigDict(strict=True, extra="forbid")


_NO_DATA: Any = object()  # param_error of a Python call: no request to read the names from


class NotJson(ValueError):
    """A request body or field that is not JSON at all (the HTTP layer's 400)."""


if TYPE_CHECKING:  # mypy reads a spec class as the pydantic dataclass it is
    from pydantic.dataclasses import dataclass as spec
else:

    def spec(cls: type[T]) -> type[T]:
        """`cls` as a frozen, strictly validated dataclass whose constructor raises ParamError.
        A class attribute `__schema_extra__` (a dict) is added to its JSON schema."""
        config = SPEC_CONFIG
        if "__schema_extra__" in cls.__dict__:
            config = ConfigDict(**SPEC_CONFIG, json_schema_extra=cls.__dict__["__schema_extra__"])
        validated: Any = pydantic_dataclass(frozen=True, config=config)(cls)
        init = validated.__init__

        @functools.wraps(init)
        def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                init(self, *args, **kwargs)
            except ValidationError as exc:
                raise param_error(exc) from None

        validated.__init__ = checked_init
        return validated


def where(location: tuple[int | str, ...], prefix: str = "") -> str:
    """A field's location as a client spells it: ("receivers", 2, "start") -> receivers[2].start."""
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in location).lstrip(".")
    return f"{prefix}{text}" if text else prefix.rstrip(".")


def _spelled(location: tuple[int | str, ...], data: Any = _NO_DATA, missing: bool = False) -> tuple[int | str, ...]:
    """A pydantic error location without what the request never spelled: the tags pydantic
    puts in it for a union's members (a discriminator's value, "list[int]", a class name)
    and its validator functions. With the request's `data`, a part is kept when the data
    has it (a key or an index of the node reached so far), or when it is the field found
    `missing`; without, only by the look of the tags."""
    parts = [p for p in location if not str(p).startswith("function-")]
    kept: list[int | str] = []
    node = data
    for index, part in enumerate(parts):
        if data is not _NO_DATA:
            if isinstance(node, dict) and isinstance(part, str) and part in node:
                kept.append(part)
                node = node[part]
                continue
            if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                kept.append(part)
                node = node[part]
                continue
            if not (missing and index == len(parts) - 1):
                continue  # a union member's tag
        if isinstance(part, str) and ("[" in part or part[:1].isupper()):
            continue  # a type's or a class's name
        kept.append(part)
    return tuple(kept)


def param_error(exc: ValidationError, prefix: str = "", data: Any = _NO_DATA) -> ParamError:
    """The one translation of a pydantic error: a ParamError naming the first field at fault,
    its message listing every error ("field.sub[2]: message; ..."), the fields named as the
    request spells them (`data`: the request, decoded, when there is one). A ParamError
    raised by a `__post_init__` comes back as it was raised, under the field it came from."""
    errors = exc.errors()
    for error in errors:
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, ParamError):
            location = where(_spelled(tuple(error["loc"]), data, error["type"] == "missing"), prefix)
            if not location:
                return cause
            return ParamError(f"{location}.{cause.field}" if cause.field else location, cause.message, cause.code)
    located = [
        (where(_spelled(tuple(error["loc"]), data, error["type"] == "missing"), prefix), error["msg"])
        for error in errors
    ]
    field, message = located[0]
    others = "".join(f"; {place}: {text}" if place else f"; {text}" for place, text in located[1:])
    return ParamError(field, message + others)


def from_json(kind: type[T], data: str | bytes, prefix: str = "") -> T:
    """`data` (JSON text) as an instance of the spec class `kind`: NotJson when it is not
    JSON, ParamError naming the field when it does not validate. `prefix` is prepended to
    field names ("params." for a form's options)."""
    try:
        return TypeAdapter(kind).validate_json(data, strict=True)
    except ValidationError as exc:
        invalid = [error for error in exc.errors() if error["type"] == "json_invalid"]
        if invalid:
            what = f"the field '{prefix.rstrip('.')}'" if prefix else "the body"
            raise NotJson(f"{what} is not JSON: {invalid[0]['msg']}") from None
        raise param_error(exc, prefix, json.loads(data)) from None


def from_mapping(kind: type[T], values: Mapping[str, Any], prefix: str = "") -> T:
    """`values` (decoded JSON: str, int, float, bool, None, lists, dicts) as `kind`, as
    strictly as `from_json` would read them."""
    return from_json(kind, json.dumps(values), prefix)


def to_json(value: Any) -> dict[str, Any]:
    """A spec instance as the JSON object a client would send (nested specs as objects)."""
    dumped: dict[str, Any] = TypeAdapter(type(value)).dump_python(value, mode="json")
    return dumped


def json_schema(kind: type) -> dict[str, Any]:
    """The JSON schema of a spec class or a Result model, nested schemas written in place (a
    schema inside an OpenAPI document cannot resolve pydantic's "#/$defs/..." references)."""
    return copy.deepcopy(_inline_schema(kind))


@functools.cache
def _inline_schema(kind: type) -> dict[str, Any]:
    schema = TypeAdapter(kind).json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:  # a nested spec, maybe with its own description beside the reference
                here = {key: value for key, value in node.items() if key != "$ref"}
                return {**inline(definitions[node["$ref"].rsplit("/", 1)[-1]]), **inline(here)}
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(value) for value in node]
        return node

    return inline(schema)


def check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """`value` as an int within [minimum, maximum], or ParamError naming `name` (a bool is no
    integer). For arguments of plain functions; spec fields say their bounds with Field."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ParamError(name, f"expected an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ParamError(name, f"must be >= {minimum}; got {value}")
    if maximum is not None and value > maximum:
        raise ParamError(name, f"must be <= {maximum}; got {value}")
    return value


@spec
class MatrixShape:
    """The shape of a generated matrix, the first fields of every kind's matrix spec."""

    m: int = Field(ge=1, description="rows")
    n: int = Field(ge=1, description="columns")


class Result(BaseModel):
    """Base of the kinds' result schemas: every key of the summary is declared (the tests
    validate real results against them, so the docs cannot drift from the code)."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class InputFile:
    """A file a job takes in a multipart form: its part name, what it holds, and whether it
    must be there."""

    name: str
    description: str
    required: bool = True


@dataclass(frozen=True)
class JobSpec:
    """What a kind of batch job takes and gives, declared once in gpu/<kind>/params.py.

    body: the spec class of a JSON request (None: the kind takes forms only);
    options: the spec class of a form's `params` JSON (None: JSON requests only);
    files: the form's file parts; result: the JSON summary's schema; example: a JSON
    request; result_files: a sentence on the result files it writes."""

    name: str
    summary: str
    body: type | None
    options: type | None
    files: tuple[InputFile, ...]
    result: type[Result]
    example: Mapping[str, Any]
    result_files: str = ""
    form_example: str = ""
