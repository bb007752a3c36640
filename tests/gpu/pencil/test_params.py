"""Option.parse (gpu/pencil/params.py): the one place option strings from the API (form
and query) and the command line become numbers. Numbers are ASCII: what Python's float()
takes beyond that (other scripts' digits, fullwidth digits, underscores, nan, inf) is a
ParamError naming the option."""

from __future__ import annotations

import pytest

from gpu.codec.encode import ENCODE_OPTIONS
from gpu.errors import ParamError
from gpu.pencil.params import PENCIL_OPTIONS, PencilParams

OPTIONS = {option.name: option for option in PENCIL_OPTIONS + ENCODE_OPTIONS}


@pytest.mark.parametrize(
    ("name", "raw", "value"),
    [
        ("max_side", "500", 500),
        ("max_side", "+500", 500),
        ("max_side", " 500 ", 500),
        ("max_side", "500.0", 500),
        ("max_side", "5e2", 500),
        ("max_side", "5E+2", 500),
        ("quality", "90", 90),
        ("stroke_width", "0", 0),
        ("line_frac", "0.05", 0.05),
        ("line_frac", ".05", 0.05),
        ("line_frac", "5e-2", 0.05),
        ("stroke_gamma", "2.", 2.0),
        ("tone_gamma", "1", 1.0),
        ("max_side", 500, 500),  # values, not strings, as a caller in Python gives them
        ("line_frac", 0.05, 0.05),
    ],
)
def test_ascii_numbers_parse(name, raw, value):
    parsed = OPTIONS[name].parse(raw)
    assert parsed == pytest.approx(value) and type(parsed) is OPTIONS[name].type


@pytest.mark.parametrize(
    "raw",
    [
        "\u0665\u0660\u0660",  # Arabic-Indic 500: float() takes it
        "\uff15\uff10\uff10",  # fullwidth 500
        "\u096b\u0966\u0966",  # Devanagari 500
        "5_00",
        "1_000",
        "nan",
        "inf",
        "-Infinity",
        "0x1f4",
        "500px",
        "5 00",
        "",
        "+",
        ".",
        "e5",
        "5e",
        "\u00a0500",  # a no-break space is no ASCII blank
        "500\u2003",
        True,  # a bool is no number
        None,
    ],
)
def test_anything_else_is_refused_naming_the_option(raw):
    with pytest.raises(ParamError) as caught:
        OPTIONS["max_side"].parse(raw)
    assert caught.value.field == "max_side"
    assert str(caught.value).startswith("max_side:")


@pytest.mark.parametrize("name", ["line_frac", "stroke_width", "stroke_gamma", "tone_gamma", "max_side", "quality"])
def test_every_number_option_refuses_other_digits(name):
    with pytest.raises(ParamError, match=f"^{name}:"):
        OPTIONS[name].parse("\uff11")  # fullwidth 1


def test_out_of_range_after_parsing_still_refused():
    with pytest.raises(ParamError, match="max_side: must be <= 65500"):
        OPTIONS["max_side"].parse("1e5")
    with pytest.raises(ParamError, match="max_side: expected a finite number"):
        OPTIONS["max_side"].parse("1e999")
    with pytest.raises(ParamError, match="stroke_width: expected an integer"):
        OPTIONS["stroke_width"].parse("1.5")


def test_from_options_uses_the_same_rule():
    assert PencilParams.from_options({"max_side": "640", "line_frac": "0.04"}).max_side == 640
    with pytest.raises(ParamError, match="^max_side:"):
        PencilParams.from_options({"max_side": "\u0666\u0664\u0660"})
