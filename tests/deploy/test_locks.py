"""The dependency locks (locks/*.txt, made by locks/refresh.sh) against pyproject.toml, each
other, the Dockerfile and the README: what users install is what CI tested.

Each lock is a universal resolution with markers; it is read here for the Pythons we test on
Linux x86_64 (CI's 3.11, the image's 3.12), as pip would evaluate it there."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "locks"
_spec = importlib.util.spec_from_file_location("lock_pins", LOCKS / "pins.py")
assert _spec is not None and _spec.loader is not None
lock_pins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock_pins)
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# lock -> the extras of pyproject.toml it resolves
INSTALLS = {
    "cpu.txt": ("postgres",),
    "cuda12.txt": ("cuda", "postgres"),
    "cuda13.txt": ("cuda13", "postgres"),
    "test.txt": ("test",),
}
PYTHONS = ("3.11.7", "3.12.3")


def pins(lock: str, python: str) -> dict[str, str]:
    """{canonical name: version} that pip installs from `lock` on `python`."""
    return lock_pins.pins(LOCKS / lock, python)


def wanted(extras: tuple[str, ...], python: str) -> list[Requirement]:
    """pyproject.toml's requirements of an install with `extras`, self-references expanded."""
    requirements = [Requirement(text) for text in PYPROJECT["dependencies"]]
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in PYPROJECT["optional-dependencies"][extra]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == canonicalize_name(PYPROJECT["name"]):
                pending.extend(requirement.extras)
            else:
                requirements.append(requirement)
    return [r for r in requirements if r.marker is None or r.marker.evaluate(lock_pins.environment(python))]


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("lock", sorted(INSTALLS))
def test_each_lock_pins_every_requirement_within_pyprojects_bounds(lock, python):
    pinned = pins(lock, python)
    assert len(pinned) > 20
    for requirement in wanted(INSTALLS[lock], python):
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{lock} lacks {requirement} on Python {python}: run locks/refresh.sh"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{lock} pins {name}=={pinned[name]}, outside pyproject's {requirement}: run locks/refresh.sh"
        )


@pytest.mark.parametrize("lock", sorted(INSTALLS))
def test_every_pin_carries_hashes_and_every_lock_the_same_date(lock):
    text = (LOCKS / lock).read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    for block in blocks:
        if "==" in block.split("\n")[0]:
            assert "--hash=sha256:" in block, f"{lock}: no hash for {block.split()[0]}"
    header = re.search(r"bash locks/refresh\.sh (\d{4}-\d{2}-\d{2})", text)
    assert header, f"{lock} was not made by locks/refresh.sh"
    dates = {re.search(r"refresh\.sh (\S+)", (LOCKS / other).read_text()).group(1) for other in INSTALLS}
    assert dates == {header.group(1)}, "the locks were refreshed at different dates"


@pytest.mark.parametrize("python", PYTHONS)
def test_the_locks_agree_wherever_they_share_a_package(python):
    """cuda13.txt is installed over test.txt for the GPU tests: the two must not disagree."""
    by_lock = {lock: pins(lock, python) for lock in INSTALLS}
    for name in set().union(*by_lock.values()):
        versions = {lock: found[name] for lock, found in by_lock.items() if name in found}
        assert len(set(versions.values())) == 1, f"{name} differs between locks on Python {python}: {versions}"


def test_pyav_19_on_the_images_python_and_18_where_19_has_no_wheel():
    """The point of the fork: the video job runs on the PyAV each Python gets."""
    assert pins("cuda12.txt", "3.12.3")["av"].startswith("19.")
    assert Version(pins("test.txt", "3.11.7")["av"]) < Version("19")


def test_the_image_installs_through_its_lock_with_headers_of_its_cuda():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"pip install [^\n]*--require-hashes -r locks/cuda12\.txt", dockerfile)
    assert re.search(r"pip install [^\n]*--no-deps \.", dockerfile)
    cuda = re.search(r"ARG CUDA_VERSION=(\d+)\.(\d+)\.", dockerfile)
    assert cuda, "the Dockerfile names its CUDA image"
    headers = pins("cuda12.txt", "3.12.3")["nvidia-cuda-runtime-cu12"]
    assert headers.split(".")[:2] == [cuda.group(1), cuda.group(2)], (
        f"the CUDA headers ({headers}) must match the image's CUDA {cuda.group(1)}.{cuda.group(2)} (NVRTC)"
    )


def test_the_readmes_tests_install_the_test_lock():
    readme = (ROOT / "README.md").read_text()
    assert "pip install --require-hashes -r locks/test.txt" in readme
