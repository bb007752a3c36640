"""app/cli.py: `pencil-gpu sketch` draws files into a directory with the API's options;
`pencil-gpu serve` hands its host and port to uvicorn."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pencil_testkit import encode, open_image, photo

from app import cli
from app.config import get_settings
from gpu.backend import cuda_devices, cuda_pipeline_available

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def cpu_settings(monkeypatch, tmp_path):
    """The CLI reads get_settings() (cached): point it at the CPU, away from any .env."""
    for key in list(os.environ):
        if key.startswith("PENCIL_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("PENCIL_BACKEND", "cpu")
    monkeypatch.chdir(tmp_path)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def inputs(tmp_path, rng) -> dict[str, tuple[Path, tuple[int, int]]]:
    """Two real photos on disk: a.jpg (color) and b.png (gray), with their (w, h)."""
    folder = tmp_path / "in"
    folder.mkdir()
    a_size = (int(rng.integers(64, 160)), int(rng.integers(64, 160)))
    b_size = (int(rng.integers(64, 160)), int(rng.integers(64, 160)))
    a = folder / "a.jpg"
    a.write_bytes(encode(photo("astronaut", *a_size, rng=rng), "jpeg"))
    b = folder / "b.png"
    b.write_bytes(encode(photo("camera", *b_size, rng=rng), "png"))
    return {"a": (a, a_size), "b": (b, b_size)}


def test_sketch_two_files(inputs, tmp_path, capsys):
    out = tmp_path / "out" / "nested"  # created if missing
    (a, a_size), (b, b_size) = inputs["a"], inputs["b"]
    assert cli.main(["sketch", str(a), str(b), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["a-sketch.png", "b-sketch.png"]
    for name, size in (("a-sketch.png", a_size), ("b-sketch.png", b_size)):
        image = open_image((out / name).read_bytes())
        assert image.format == "PNG" and image.size == size and image.mode == "L"
        assert np.asarray(image).std() > 5
    assert "2 of 2 drawn" in capsys.readouterr().err


def test_missing_file_is_status_1_and_the_others_are_drawn(inputs, tmp_path, capsys):
    out = tmp_path / "out"
    (a, _), (b, _) = inputs["a"], inputs["b"]
    missing = tmp_path / "in" / "missing.jpg"
    assert cli.main(["sketch", str(a), str(missing), str(b), "-o", str(out)]) == 1
    assert sorted(p.name for p in out.iterdir()) == ["a-sketch.png", "b-sketch.png"]
    err = capsys.readouterr().err
    assert "missing.jpg" in err and "2 of 3 drawn" in err


def test_unreadable_image_is_status_1(inputs, tmp_path, capsys):
    notes = tmp_path / "in" / "notes.jpg"
    notes.write_text("not a photo\n")
    tiny = tmp_path / "in" / "tiny.png"
    tiny.write_bytes(encode(np.full((4, 4), 200, np.uint8), "png"))
    out = tmp_path / "out"
    assert cli.main(["sketch", str(notes), str(tiny), str(inputs["a"][0]), "-o", str(out)]) == 1
    assert [p.name for p in out.iterdir()] == ["a-sketch.png"]
    err = capsys.readouterr().err
    assert "notes.jpg" in err and "tiny.png" in err


@pytest.mark.parametrize(
    "args",
    [
        ["--line-frac", "9"],
        ["--stroke-width", "6"],
        ["--quality", "0"],
        ["--stroke-gamma", "nan"],
        ["--max-side", "big"],
        ["--max-side", "\u0665\u0660\u0660"],  # Arabic-Indic 500: ASCII digits only
    ],
)
def test_bad_option_values_are_status_2(inputs, tmp_path, capsys, args):
    out = tmp_path / "out"
    assert cli.main(["sketch", str(inputs["a"][0]), "-o", str(out), *args]) == 2
    assert not out.exists() or not any(out.iterdir())
    assert args[0].lstrip("-").replace("-", "_") in capsys.readouterr().err


def test_unknown_choice_is_an_argparse_error(inputs, tmp_path):
    with pytest.raises(SystemExit) as caught:
        cli.main(["sketch", str(inputs["a"][0]), "-o", str(tmp_path / "out"), "--mode", "sepia"])
    assert caught.value.code == 2


@pytest.mark.parametrize(
    ("fmt", "extension", "pil"), [("webp", "webp", "WEBP"), ("jpeg", "jpg", "JPEG"), ("png", "png", "PNG")]
)
def test_output_format(inputs, tmp_path, fmt, extension, pil):
    out = tmp_path / "out"
    (a, a_size), (b, b_size) = inputs["a"], inputs["b"]
    assert cli.main(["sketch", str(a), str(b), "-o", str(out), "--format", fmt, "--quality", "80"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [f"a-sketch.{extension}", f"b-sketch.{extension}"]
    for name, size in ((f"a-sketch.{extension}", a_size), (f"b-sketch.{extension}", b_size)):
        image = open_image((out / name).read_bytes())
        assert image.format == pil and image.size == size


def test_pencil_options(inputs, tmp_path):
    out = tmp_path / "out"
    a, (width, height) = inputs["a"]
    args = [
        "--mode",
        "color",
        "--tone",
        "dark",
        "--texture",
        "fast",
        "--line-frac",
        "0.05",
        "--stroke-width",
        "2",
        "--stroke-gamma",
        "1.5",
        "--tone-gamma",
        "1.2",
        "--max-side",
        "48",
    ]
    assert cli.main(["sketch", str(a), "-o", str(out), *args]) == 0
    image = open_image((out / "a-sketch.png").read_bytes())
    assert image.mode == "RGB"
    assert max(image.size) == 48


def test_same_drawing_as_the_api(inputs, tmp_path, client):
    out = tmp_path / "out"
    a, _ = inputs["a"]
    assert cli.main(["sketch", str(a), "-o", str(out), "--tone", "medium"]) == 0
    response = client.post("/sketch", files={"image": ("a.jpg", a.read_bytes(), "image/jpeg")}, data={"tone": "medium"})
    assert response.status_code == 200
    assert np.array_equal(
        np.asarray(open_image(response.content)), np.asarray(open_image((out / "a-sketch.png").read_bytes()))
    )


@pytest.mark.skipif(bool(cuda_devices()) and cuda_pipeline_available(), reason="CUDA is available here")
def test_unavailable_backend_is_status_2(inputs, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PENCIL_BACKEND", "cuda")
    get_settings.cache_clear()
    assert cli.main(["sketch", str(inputs["a"][0]), "-o", str(tmp_path / "out")]) == 2
    assert "cuda" in capsys.readouterr().err.lower()


def test_parser():
    parser = cli.build_parser()
    args = parser.parse_args(["serve", "--port", "9123", "--host", "0.0.0.0"])
    assert (args.command, args.port, args.host) == ("serve", 9123, "0.0.0.0")
    args = parser.parse_args(["serve"])
    assert args.port is None and args.host is None
    args = parser.parse_args(["sketch", "x.jpg", "y.png", "-o", "out", "--line-frac", "0.05"])
    assert args.command == "sketch" and [p.name for p in args.inputs] == ["x.jpg", "y.png"]
    assert args.line_frac == "0.05" and args.mode is None
    for bad in (["serve", "--port", "eighty"], [], ["sketch", "x.jpg"], ["draw"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_serve_passes_host_and_port_to_uvicorn(monkeypatch):
    import uvicorn

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: calls.append((args, kwargs)))
    assert cli.main(["serve", "--port", "9123"]) == 0
    ((args, kwargs),) = calls
    assert kwargs["app"] == "app.main:create_app" and kwargs["factory"] is True
    assert kwargs["ws_per_message_deflate"] is False  # /live's JPEGs do not deflate
    assert kwargs["port"] == 9123 and kwargs["host"] == "127.0.0.1"

    calls.clear()
    monkeypatch.setenv("PENCIL_HOST", "0.0.0.0")
    monkeypatch.setenv("PENCIL_PORT", "8111")
    get_settings.cache_clear()
    assert cli.main(["serve"]) == 0
    assert (calls[0][1]["host"], calls[0][1]["port"]) == ("0.0.0.0", 8111)


def test_help_lists_every_option():
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "sketch", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    for flag in (
        "--mode",
        "--tone",
        "--texture",
        "--line-frac",
        "--stroke-width",
        "--stroke-gamma",
        "--tone-gamma",
        "--max-side",
        "--format",
        "--quality",
        "--temporal",
    ):
        assert flag in result.stdout


def test_a_failing_render_does_not_abort_the_batch(inputs, tmp_path, monkeypatch):
    real_draw = cli.pencil.draw_bytes
    calls = []

    def flaky_draw(data, photo, params, fmt, quality, backend="cpu"):
        calls.append(photo.size)
        if len(calls) == 1:
            raise RuntimeError("render failed")
        return real_draw(data, photo, params, fmt, quality, backend)

    monkeypatch.setattr(cli.pencil, "draw_bytes", flaky_draw)
    out = tmp_path / "out"
    assert cli.main(["sketch", str(inputs["a"][0]), str(inputs["b"][0]), "-o", str(out)]) == 1
    assert [p.name for p in out.iterdir()] == ["b-sketch.png"]


def test_inputs_with_the_same_name_do_not_overwrite_each_other(tmp_path):
    first, second = tmp_path / "a" / "x.jpg", tmp_path / "b" / "x.jpg"
    third = tmp_path / "b" / "x.png"
    for path, name in ((first, "chelsea"), (second, "coffee"), (third, "astronaut")):
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(encode(photo(name, 96), "png" if path.suffix == ".png" else "jpeg"))
    out = tmp_path / "out"
    assert cli.main(["sketch", str(first), str(second), str(third), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["x-sketch-2.png", "x-sketch-3.png", "x-sketch.png"]
    drawings = [
        np.asarray(open_image((out / name).read_bytes()))
        for name in ("x-sketch.png", "x-sketch-2.png", "x-sketch-3.png")
    ]
    assert not np.array_equal(drawings[0], drawings[1]) and not np.array_equal(drawings[1], drawings[2])


def test_output_names_ignore_case():
    paths = cli.output_paths([Path("X.jpg"), Path("d/x.png"), Path("y.webp")], Path("out"), "png")
    assert [p.name for p in paths] == ["X-sketch.png", "x-sketch-2.png", "y-sketch.png"]


def test_version_prints_the_package_version_and_exits_0(capsys):
    from app.main import VERSION

    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"pencil-gpu {VERSION}\n"
    # as a user runs it: a command, no subcommand needed, nothing on stderr
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "--version"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"pencil-gpu {VERSION}\n" and result.stderr == ""


def test_serve_without_batch_jobs_makes_no_data_directory(tmp_path):
    """`pencil-gpu serve` with the default PENCIL_DATA_DIR (./data) and no admin token
    draws and is ready, and leaves the directory it runs in as it found it."""
    import httpx
    from pencil_testkit import free_port, photo_bytes, server_env, server_process, sketch_files

    workdir = tmp_path / "empty"
    workdir.mkdir()
    port = free_port()
    env = server_env(workdir, port=str(port))
    del env["PENCIL_DATA_DIR"]  # the default, relative to the working directory
    base = f"http://127.0.0.1:{port}"
    with server_process([sys.executable, "-m", "app.cli", "serve"], workdir, env, base, ready_path="/readyz"):
        response = httpx.post(f"{base}/sketch", files=sketch_files(photo_bytes("chelsea", "jpeg", 96)), timeout=30)
        assert response.status_code == 200
        assert httpx.get(f"{base}/readyz", timeout=10).json() == {"ready": True}
    assert sorted(p.name for p in workdir.iterdir()) == ["server.log"]


# ------------------------------------------------------------------- videos --


def test_a_video_is_drawn_frame_by_frame_with_its_sound(inputs, tmp_path, capsys):
    """A real clip (a photograph panned, a sine as its sound; tests/gpu/video/clips.py)
    beside a photo: out/clip-sketch.mp4 holds every frame drawn, the sound copied."""
    import av

    from gpu.pencil import reference
    from gpu.pencil.params import PencilParams
    from tests.gpu.video.clips import decoded_frames, drawn_frames, make_clip

    clip = tmp_path / "in" / "clip.mp4"
    clip.write_bytes(make_clip("mp4", width=160, height=120, frames=16, fps=24))
    out = tmp_path / "out"
    args = ["sketch", str(clip), str(inputs["a"][0]), "-o", str(out), "--texture", "fast", "--temporal", "none"]
    assert cli.main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == ["a-sketch.png", "clip-sketch.mp4"]
    data = (out / "clip-sketch.mp4").read_bytes()
    with av.open(str(out / "clip-sketch.mp4")) as drawing:
        video, audio = drawing.streams.video[0], drawing.streams.audio[0]
        assert (video.codec_context.name, video.frames, video.width, video.height) == ("h264", 16, 160, 120)
        assert video.average_rate == 24 and audio.codec_context.name == "aac"
    expected = reference.render(decoded_frames(clip.read_bytes())[8], PencilParams(texture="fast"))
    assert expected.std() > 10 and np.abs(drawn_frames(data)[8].astype(np.int16) - expected).mean() < 6
    err = capsys.readouterr().err
    assert "16 frames, 160x120, aac sound copied" in err and "2 of 2 drawn" in err


def test_video_options_apply(tmp_path):
    import av

    from tests.gpu.video.clips import make_clip

    clip = tmp_path / "clip.mkv"
    clip.write_bytes(make_clip("mkv", width=200, height=150, frames=6, audio=None, photo="coffee"))
    out = tmp_path / "out"
    assert cli.main(["sketch", str(clip), "-o", str(out), "--max-side", "80", "--mode", "color"]) == 0
    with av.open(str(out / "clip-sketch.mp4")) as drawing:
        frame = next(drawing.decode(video=0)).to_ndarray(format="rgb24")
        assert not drawing.streams.audio
    assert frame.shape == (60, 80, 3) and np.abs(frame[..., 0].astype(int) - frame[..., 2]).mean() > 5


def test_a_broken_video_is_status_1_and_leaves_nothing(inputs, tmp_path, capsys):
    broken = tmp_path / "in" / "broken.mp4"
    broken.write_bytes(b"not a video\n" * 50)
    out = tmp_path / "out"
    assert cli.main(["sketch", str(broken), str(inputs["b"][0]), "-o", str(out)]) == 1
    assert sorted(p.name for p in out.iterdir()) == ["b-sketch.png"]  # no partial file left either
    err = capsys.readouterr().err
    assert "broken.mp4" in err and "not a video" in err and "1 of 2 drawn" in err


def test_output_names_of_videos():
    paths = cli.output_paths([Path("a.mp4"), Path("a.jpg"), Path("b/A.MOV"), Path("c.webm")], Path("out"), "png")
    assert [p.name for p in paths] == ["a-sketch.mp4", "a-sketch.png", "A-sketch-2.mp4", "c-sketch.mp4"]


def test_an_unknown_temporal_is_an_argparse_error(inputs, tmp_path):
    with pytest.raises(SystemExit) as caught:
        cli.main(["sketch", str(inputs["a"][0]), "-o", str(tmp_path / "out"), "--temporal", "smooth"])
    assert caught.value.code == 2
