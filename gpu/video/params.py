"""Parameters of the video job, validated once, and the job object the store keeps.

`VideoParams`: the drawing options of /sketch (a PencilParams, same names and bounds)
and `temporal`, how the tone holds still from frame to frame (gpu/video/temporal.py).
`VideoJob`: the clip (its bytes when submitted, its stored file once rehydrated), what
probing its header found, and the parameters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu.errors import ParamError
from gpu.pencil.params import PENCIL_OPTIONS, PencilParams
from gpu.video.probe import ClipInfo, Source, probe

TEMPORAL_CHOICES = ("steady", "none")
TEMPORAL_HELP = (
    "steady: every frame's tone goes through one LUT built from a running average of the frames' histograms "
    "(1 s), so a still part of the scene keeps its tone; none: each frame's tone matched to its own histogram, "
    "as /sketch does"
)
VIDEO_FILE = "video"  # the clip's name among the job's stored inputs
OPTION_NAMES = tuple(option.name for option in PENCIL_OPTIONS) + ("temporal",)


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
    def from_values(cls, values: Mapping[str, Any]) -> VideoParams:
        """From JSON values keyed by option name (each of the right type, not a string for
        a number: the job API is strict); ParamError for an unknown name or a bad value."""
        unknown = sorted(set(values) - set(OPTION_NAMES))
        if unknown:
            raise ParamError(unknown[0], f"unknown option; the options are {', '.join(OPTION_NAMES)}")
        pencil = {name: value for name, value in values.items() if name != "temporal" and value is not None}
        temporal = values.get("temporal", "steady")
        if not isinstance(temporal, str):
            raise ParamError("temporal", f"expected a string, got {temporal!r}")
        return cls(PencilParams(**pencil), temporal)

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
