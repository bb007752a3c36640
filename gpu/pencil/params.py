"""Parameters of the pencil pipeline: one validated object shared by both backends.

`PENCIL_OPTIONS` is the single description of every user-facing option (type, default,
bounds, help); the HTTP API builds its docs and parsing from it and the CLI its flags,
so a bound changes in one place. The paper's fixed constants (Lu, Xu & Jia 2012) live
here too, under their names in the paper.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu.errors import ParamError

# --- Tone model of Lu et al., on the 0..255 scale --------------------------------------
SIGMA_B = 9.0  # bright layer: Laplacian decay from white
U_A, U_B = 105.0, 225.0  # mid layer: uniform range
MU_D, SIGMA_D = 90.0, 11.0  # dark layer: Gaussian
TONE_WEIGHTS: dict[str, tuple[float, float, float]] = {
    # bright : mid : dark (Lu's presets; the presets below start from the photo's own fit)
    "light": (76.0, 22.0, 2.0),
    "medium": (52.0, 37.0, 11.0),
    "dark": (42.0, 29.0, 29.0),
}
# The presets as moves of tone="auto"'s fit (issue 38): (layer, share): the share of the
# fitted mixture's weight moved onto that layer (0 bright, 2 the fit's dark layer). Every
# layer's CDF lies between the bright layer's and the dark one's, so moving weight to the
# bright layer lowers the target CDF everywhere: every grey level of the photo is drawn at
# least as light as auto draws it (and to the dark layer, at least as dark), while the
# photo's own order of light and dark, which the fit follows, is kept. Lu's fixed presets
# (TONE_WEIGHTS) squeezed a photo with large dark areas into a near-flat band by white.
TONE_SHIFTS: dict[str, tuple[int, float]] = {"light": (0, 0.3), "medium": (0, 0.15), "dark": (2, 0.3)}

# --- Texture rendering ----------------------------------------------------------------
HATCH_TURNS = 8  # hatching="follow": the texture turned by k * pi / 8, two neighbours blended
# Where the photo has no direction (flat, or as strong every way), the hatching keeps the
# tile's own: a bias toward it of this share of the tensor's isotropic part, plus a floor.
HATCH_BIAS, HATCH_BIAS_FLOOR = 0.3, 1e-4
# The turned texture's scale follows the drawing's size: the tile at its own scale on a
# drawing whose shorter side is this many px, enlarged or shrunk in proportion otherwise.
HATCH_SCALE_SIDE = 1080
# Cross-hatching where one layer is not dark enough (issue 38): below the first tone J a
# second layer, the tile turned a quarter turn, joins the hatching, in full at the second:
# ln H_x = ln H + c(J) ln H_turned, c rising linearly from 0 to 1 between the two.
CROSS_HATCH_TONES = (0.55, 0.3)
LU_LAMBDA = 0.2  # smoothness weight of beta in Lu's energy
# Lu's reference asks PCG for a relative residual of 1e-6 in double precision, at most 60
# iterations. In float32 that is below rounding noise; 1e-3 leaves a 1080p drawing within
# 1.5 grey levels (mean 0.01) of the fully converged one, in about half the iterations.
CG_TOLERANCE = 1e-3
CG_MAX_ITERATIONS = 60

# --- Strokes that keep the tone (issue 38) ------------------------------------------------
# The strokes darken with S ** (STROKE_POWER * stroke_gamma * (1 + STROKE_DEEPENING (1 - J))):
# darker, crisper outlines than Lu's S, darker still where the tone J is dark, since the
# balance below keeps them from darkening any region below its tone: in a dark region they
# carry more of its darkness and the tone between them is drawn lighter.
STROKE_POWER = 2.0
STROKE_DEEPENING = 4.0
# Over a square of the line length the strokes may darken the drawing on average by at most
# the tone's own darkness 1 - J plus STROKE_BUDGET (a little room, so that an outline between
# two white regions still shows). Denser strokes are thinned first: their darkness d becomes
# d ** p, 1 <= p <= STROKE_THINNING_MAX, which keeps the dark cores of the outlines and drops
# their faint flanks; only past that are they drawn lighter. The tone under them is then
# lightened by what they darken, so that a region's mean stays its tone. Chosen on the
# tuning and texture photos with bench/quality.py (BENCHMARKS.md, "Drawing quality").
STROKE_BUDGET = 0.02
STROKE_THINNING_MAX = 4.0

DIRECTIONS = 8  # line directions at i * pi / 8
MIN_SIDE = 16  # px: smaller images carry too little structure to draw

# A number in an option string: ASCII digits with an optional sign, decimal point and
# exponent ("12", "-0.5", ".5", "1e3"). float() also takes "١٢" and "１２" (other scripts'
# digits), "1_000", "nan" and "inf"; none of them is a number here.
NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class LineKernelTooLarge(RuntimeError):
    """The line kernels (huge line length and width) do not fit the GPU line passes: the
    drawing is made on the CPU instead."""


@dataclass(frozen=True)
class Option:
    """One user-facing option: its name, type, default, bounds and a help sentence."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None

    def parse(self, raw: Any) -> Any:
        """Coerce `raw` (a string from a form, query or command line, or a value) and check it.
        A number given as a string is written as NUMBER says (ASCII digits), blanks around it
        allowed."""
        value: Any
        if self.type is str:
            value = str(raw).strip().lower()
        else:
            if isinstance(raw, str):
                if not NUMBER.fullmatch(raw.strip(" \t\r\n")):
                    raise ParamError(self.name, f"expected a number in ASCII digits (like 12 or 0.5), got {raw!r}")
                number = float(raw)
            elif isinstance(raw, numbers.Real) and not isinstance(raw, bool):
                number = float(raw)
            else:
                raise ParamError(self.name, f"expected a number, got {raw!r}")
            if not math.isfinite(number):
                raise ParamError(self.name, f"expected a finite number, got {raw!r}")
            if self.type is int:
                if number != int(number):
                    raise ParamError(self.name, f"expected an integer, got {raw!r}")
                value = int(number)
            else:
                value = number
        self.check(value)
        return value

    def check(self, value: Any) -> None:
        """Raise ParamError unless `value` has this option's type and lies in its range."""
        if self.type is str:
            if not isinstance(value, str):
                raise ParamError(self.name, f"expected a string, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, numbers.Integral if self.type is int else numbers.Real):
            raise ParamError(self.name, f"expected {'an integer' if self.type is int else 'a number'}, got {value!r}")
        elif not isinstance(value, numbers.Integral) and not math.isfinite(value):
            raise ParamError(self.name, f"expected a finite number, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ParamError(self.name, f"must be one of {', '.join(self.choices)}; got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise ParamError(self.name, f"must be >= {self.minimum:g}; got {value}")
        if self.maximum is not None and value > self.maximum:
            raise ParamError(self.name, f"must be <= {self.maximum:g}; got {value}")

    def describe(self) -> str:
        """The help sentence with the range or choices and the default, for docs and --help."""
        if self.choices:
            allowed = " | ".join(self.choices)
        elif self.minimum is not None and self.maximum is not None:
            allowed = f"{self.minimum:g} .. {self.maximum:g}"
        else:
            allowed = ""
        default = (
            "none"
            if self.default is None
            else f"{self.default:g}"
            if isinstance(self.default, float)
            else str(self.default)
        )
        return f"{self.help} [{allowed}; default {default}]" if allowed else f"{self.help} [default {default}]"

    def json_schema(self) -> dict[str, Any]:
        """This option as JSON schema (OpenAPI): type, choices or bounds, default, help."""
        schema: dict[str, Any] = {
            "type": {str: "string", int: "integer", float: "number"}[self.type],
            "description": self.describe(),
        }
        if self.choices:
            schema["enum"] = list(self.choices)
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.default is not None:
            schema["default"] = self.default
        return schema


PENCIL_OPTIONS: tuple[Option, ...] = (
    Option(
        "mode",
        str,
        "gray",
        "gray: a graphite drawing; color: the drawing as luminance under the photo's chroma (YCbCr)",
        choices=("gray", "color"),
    ),
    Option(
        "tone",
        str,
        "auto",
        (
            "the tone's target distribution, Lu et al.'s layers bright:mid:dark: auto fits their weights to the "
            "photo's own histogram (a dark photo stays dark); light, medium and dark start from that fit and move "
            "0.3 and 0.15 of its weight to the bright layer, or 0.3 to the dark one: lighter to darker than auto, "
            "in the photo's own order of light and dark"
        ),
        choices=("auto", "light", "medium", "dark"),
    ),
    Option(
        "texture",
        str,
        "lu",
        "lu: beta from Lu's smooth least squares (conjugate gradient); fast: Qiu's per-pixel beta = 1 - J",
        choices=("lu", "fast"),
    ),
    Option(
        "hatching",
        str,
        "follow",
        "follow: the pencil texture's hatching turns along the photo's forms; flat: it hatches one way everywhere",
        choices=("flat", "follow"),
    ),
    Option(
        "line_frac",
        float,
        1 / 30,
        "stroke line length as a fraction of the image's shorter side",
        minimum=0.005,
        maximum=0.2,
    ),
    Option("stroke_width", int, 1, "stroke width w: the drawn line is 2w+1 px wide", minimum=0, maximum=5),
    Option(
        "stroke_gamma",
        float,
        1.0,
        "darkness of the strokes: S ** (2 stroke_gamma), and they may darken a region by stroke_gamma times "
        "its tone's darkness (above 1 darker)",
        minimum=0.1,
        maximum=5.0,
    ),
    Option(
        "tone_gamma", float, 1.0, "darkness of the tone: J ** tone_gamma (above 1 darker)", minimum=0.1, maximum=5.0
    ),
    Option(
        "max_side",
        int,
        None,
        "downscale (area filter) so the longer side is at most this many px before rendering; omit to keep the size",
        minimum=MIN_SIDE,
        maximum=65500,
    ),
)
_OPTIONS_BY_NAME = {option.name: option for option in PENCIL_OPTIONS}


def fitted_size(height: int, width: int, max_side: int | None) -> tuple[int, int]:
    """(height, width) after downscaling so the longer side is at most max_side (never up)."""
    if not max_side or max(height, width) <= max_side:
        return height, width
    scale = max_side / max(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


@dataclass(frozen=True)
class PencilParams:
    """Every parameter of one render; validated on construction (raises ParamError)."""

    mode: str = "gray"
    tone: str = "auto"
    texture: str = "lu"
    hatching: str = "follow"
    line_frac: float = 1 / 30
    stroke_width: int = 1
    stroke_gamma: float = 1.0
    tone_gamma: float = 1.0
    max_side: int | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            option = _OPTIONS_BY_NAME[field.name]
            if value is None and option.default is None:
                continue  # an optional parameter left out
            option.check(value)

    @classmethod
    def from_options(cls, raw: Mapping[str, Any]) -> PencilParams:
        """Build from strings or values keyed by option name; unknown keys are ignored,
        empty strings mean "use the default"."""
        values = {}
        for option in PENCIL_OPTIONS:
            if option.name in raw and raw[option.name] not in (None, ""):
                values[option.name] = option.parse(raw[option.name])
        return cls(**values)

    @property
    def tone_weights(self) -> tuple[float, float, float] | None:
        """Lu's fixed layer weights of the preset's name (TONE_WEIGHTS); None for tone="auto".
        The drawing no longer uses them: see tone_shift."""
        return TONE_WEIGHTS.get(self.tone)

    @property
    def tone_shift(self) -> tuple[int, float]:
        """(layer, share) the preset moves of tone="auto"'s fitted weights (TONE_SHIFTS);
        (0, 0.0) for auto itself."""
        return TONE_SHIFTS.get(self.tone, (0, 0.0))

    def line_length(self, height: int, width: int) -> int:
        """Odd length in px of the stroke lines for an image of this size (at least 3)."""
        length = int(round(min(height, width) * self.line_frac))
        length = max(3, length)
        return length if length % 2 == 1 else length + 1

    def structure_size(self, height: int, width: int) -> int:
        """Side in px (odd) of the box filter that smooths the structure tensor for
        hatching="follow": the scale of the forms the hatching follows (1/40 of the
        shorter side)."""
        return max(3, int(round(min(height, width) / 80)) * 2 + 1)

    def hatch_scale(self, height: int, width: int) -> float:
        """hatching="follow": px of the drawing per px of the texture tile: the shorter side
        over HATCH_SCALE_SIDE."""
        return min(height, width) / HATCH_SCALE_SIDE

    def tone_blur_size(self, height: int, width: int) -> int:
        """Side in px of the box filter smoothing the tone map: Lu's 10 px at ~600 px,
        kept proportional so a large photo is not smoothed less than a small one."""
        return max(3, int(round(min(height, width) / 60)))
