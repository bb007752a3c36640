"""Parameters of the video job, validated once, and the job object the store keeps.

`VideoParams`: the drawing options of /sketch (a PencilParams, same names and bounds)
and `temporal`, how the tone holds still from frame to frame (gpu/video/temporal.py).
`VideoJob`: the clip (its bytes when submitted, its stored file once rehydrated), what
probing its header found, and the parameters.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field

from gpu.errors import ParamError
from gpu.pencil.params import PENCIL_OPTIONS, PencilParams
from gpu.spec import InputFile, JobSpec, Result, from_mapping, spec
from gpu.video.probe import ClipInfo, Source, probe

Temporal = Literal["steady", "none"]
TEMPORAL_CHOICES: tuple[str, ...] = get_args(Temporal)
TEMPORAL_HELP = (
    "steady: every frame's tone goes through one LUT built from a running average of the frames' histograms "
    "(1 s), so a still part of the scene keeps its tone; none: each frame's tone matched to its own histogram, "
    "as /sketch does"
)
VIDEO_FILE = "video"  # the clip's name among the job's stored inputs
OPTION_NAMES = tuple(option.name for option in PENCIL_OPTIONS) + ("temporal",)


def _default_if_none(default: Any, value: Any) -> Any:
    return default if value is None else value


def _options_spec() -> Any:
    """The spec of a video job's options, built from the drawing options' one table
    (PENCIL_OPTIONS: same names, types, bounds, defaults and help as /sketch) and
    `temporal`. A null option takes its default."""
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {"__module__": __name__, "__doc__": "The options of a video job."}
    for option in PENCIL_OPTIONS:
        kind: Any = Literal[option.choices] if option.choices else option.type
        if option.default is None:
            kind = kind | None
        else:  # null as "the default", as /sketch reads an empty field
            kind = Annotated[kind, BeforeValidator(functools.partial(_default_if_none, option.default))]
        annotations[option.name] = kind
        namespace[option.name] = Field(
            default=option.default, ge=option.minimum, le=option.maximum, description=option.describe()
        )
    annotations["temporal"] = Temporal
    namespace["temporal"] = Field(default="steady", description=TEMPORAL_HELP)
    namespace["__annotations__"] = annotations
    return spec(type("VideoOptions", (), namespace))


VideoOptions = _options_spec()


@dataclass(frozen=True)
class VideoParams:
    """How every frame is drawn (`pencil`) and how the tone is held between frames
    (`temporal`: steady | none); validated on construction (raises ParamError)."""

    pencil: PencilParams = field(default_factory=PencilParams)
    temporal: str = "steady"

    def __post_init__(self) -> None:
        if not isinstance(self.pencil, PencilParams):
            raise ParamError("pencil", f"expected PencilParams, got {type(self.pencil).__name__}")
        if self.temporal not in TEMPORAL_CHOICES:
            raise ParamError("temporal", f"must be one of {', '.join(TEMPORAL_CHOICES)}; got {self.temporal!r}")

    @classmethod
    def from_options(cls, options: Any) -> VideoParams:
        """From a validated VideoOptions."""
        pencil = {option.name: getattr(options, option.name) for option in PENCIL_OPTIONS}
        return cls(
            PencilParams(**{name: value for name, value in pencil.items() if value is not None}), options.temporal
        )

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> VideoParams:
        """From JSON values keyed by option name (strictly: not a string for a number);
        ParamError for an unknown name or a bad value."""
        return cls.from_options(from_mapping(VideoOptions, values))

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.pencil), "temporal": self.temporal}


@dataclass(frozen=True)
class VideoJob:
    """One clip to draw: `source` (its bytes, or the path of the stored file), `info` (its
    probe) and `params`. Build with `uploaded`, which probes the clip (VideoError for one
    that cannot be drawn), or rehydrate with `from_json`."""

    params: VideoParams
    source: Source = field(repr=False)
    info: ClipInfo

    @classmethod
    def uploaded(cls, params: VideoParams, data: bytes, max_pixels: int | None = None) -> VideoJob:
        """The job of an uploaded clip, its header read and first frame decoded now."""
        return cls(params, data, probe(data, max_pixels))

    def to_json(self) -> dict[str, Any]:
        return {**self.params.to_json(), "clip": self.info.to_json()}

    def input_files(self) -> dict[str, bytes]:
        data = self.source if isinstance(self.source, bytes) else Path(self.source).read_bytes()
        return {VIDEO_FILE: data}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any], files: Mapping[str, Path]) -> VideoJob:
        values = {name: stored[name] for name in OPTION_NAMES if name in stored}
        return cls(VideoParams.from_values(values), files[VIDEO_FILE], ClipInfo.from_json(stored["clip"]))


# ----------------------------------------------------------------- the job's contract --


class VideoAudio(Result):
    codec: str = Field(description="the sound's codec in sketch.mp4")
    source_codec: str = Field(description="the clip's")
    copied: bool = Field(description="remuxed as it was; false: re-encoded to AAC (MP4 players read no other)")


class VideoEncoder(Result):
    codec: str
    preset: str = Field(description="the x264 preset")
    crf: int = Field(description="x264's constant rate factor")


class VideoResult(Result):
    frames: int = Field(description="frames drawn")
    fps: float = Field(description="the clip's nominal frame rate, kept (each frame keeps its timestamp)")
    duration_s: float
    width: int = Field(description="of the drawing: the clip's upright size after max_side, sides even")
    height: int
    time_base: str = Field(
        description="of the MP4's video: the clip's, or a finer one where MP4 needs 10,000 units a second or more"
    )
    audio: VideoAudio | None = Field(description="what became of the clip's sound; null: it has none")
    backend: str
    seconds: float = Field(description="wall time from the first packet read to the last byte written")
    frames_per_second: float = Field(description="frames / seconds")
    temporal: str
    steady_luts: int | None = Field(description="times the steady tone LUT was built (temporal steady; else null)")
    encoder: VideoEncoder
    skipped_packets: int = Field(description="video packets that did not decode and were skipped")
    source: dict[str, Any] = Field(description="the clip as probed: container, codec, size, rate, frames...")
    bytes: int = Field(description="size of sketch.mp4")


VIDEO_SPEC = JobSpec(
    name="video",
    summary="Draw every frame of a video clip in pencil: H.264 in MP4, the sound copied",
    body=None,
    options=VideoOptions,
    files=(InputFile(VIDEO_FILE, "the clip: MP4, MOV, MKV, WebM or AVI, with a video stream FFmpeg decodes"),),
    result=VideoResult,
    example={"texture": "fast", "temporal": "steady"},
    result_files="sketch.mp4 (H.264, yuv420p, the clip's sound); progress: frames drawn / frames in the clip",
    form_example='curl -F video=@clip.mp4 -F params=\'{"texture": "fast", "temporal": "steady"}\'',
)
