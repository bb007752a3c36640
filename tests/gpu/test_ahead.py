"""gpu/ahead.py: the kernels compiled ahead of time. Without a CUDA toolkit, nvcc is a stand-in
script that records its arguments; where nvcc is installed, a real source is compiled and its
fatbin checked for every kernel the launchers ask for by name. Loading a fatbin on a GPU
against NVRTC's build: tests/gpu/test_kernels_ahead.py."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from gpu import ahead

FAKE_NVCC = """#!/bin/sh
# Records its arguments and writes the -o file, as nvcc would; fails for a source named bad.cu.
echo "$@" >> "{log}"
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done
case "$*" in *bad.cu*) echo "bad.cu(1): error: expected a ;" >&2; exit 2 ;; esac
printf 'fatbin of %s' "$out" > "$out"
"""


@pytest.fixture
def fake_nvcc(tmp_path) -> tuple[str, Path]:
    log = tmp_path / "nvcc.log"
    script = tmp_path / "nvcc"
    script.write_text(FAKE_NVCC.format(log=log))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), log


def source(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def test_every_cuda_source_of_the_package_is_listed():
    assert sorted(ahead.SOURCES) == sorted(ahead.ROOT.rglob("*.cu"))


def test_the_fatbins_name_follows_the_source_and_the_options(tmp_path, monkeypatch):
    kernel = source(tmp_path, "k.cu", 'extern "C" __global__ void k() {}\n')
    first = ahead.fatbin_for(kernel)
    assert first.parent == tmp_path and re.fullmatch(r"k\.[0-9a-f]{16}\.fatbin", first.name)
    assert ahead.fatbin_for(kernel, tmp_path / "elsewhere") == tmp_path / "elsewhere" / first.name
    kernel.write_text('extern "C" __global__ void k() { }\n')  # one space more
    assert ahead.fatbin_for(kernel) != first
    edited = ahead.fatbin_for(kernel)
    monkeypatch.setattr(ahead, "COMPILE_OPTIONS", (*ahead.COMPILE_OPTIONS, "-DX=1"))
    assert ahead.fatbin_for(kernel) != edited


def test_nvcc_gets_the_options_machine_code_for_each_architecture_and_ptx_of_the_last():
    command = ahead.nvcc_command("nvcc", Path("a.cu"), Path("a.fatbin"), ("80", "90"))
    assert command[:4] == ["nvcc", "-fatbin", "--threads", "0"] and command[-3:] == ["-o", "a.fatbin", "a.cu"]
    assert all(option in command for option in ahead.COMPILE_OPTIONS)
    assert [c for c in command if c.startswith("-gencode")] == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    ]


def test_build_writes_each_fatbin_whole_and_removes_older_ones(tmp_path, fake_nvcc):
    nvcc, log = fake_nvcc
    sources = (source(tmp_path, "a.cu", "// a\n"), source(tmp_path, "b.cu", "// b\n"))
    stale = tmp_path / "a.0123456789abcdef.fatbin"
    stale.write_bytes(b"an older build")
    other = tmp_path / "ab.0123456789abcdef.fatbin"  # another source's: kept
    other.write_bytes(b"not a's")
    built = ahead.build(nvcc, ("86", "90"), sources)
    assert built == [ahead.fatbin_for(s) for s in sources]
    assert all(path.read_text() == f"fatbin of {path}.{os.getpid()}.partial" for path in built)
    assert not stale.exists() and other.exists() and not list(tmp_path.glob("*.partial"))
    assert sorted(line.split()[-1] for line in log.read_text().splitlines()) == sorted(map(str, sources))


def test_a_source_that_does_not_compile_fails_the_build_and_leaves_nothing(tmp_path, fake_nvcc):
    nvcc, _ = fake_nvcc
    bad = source(tmp_path, "bad.cu", "int x\n")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(subprocess.CalledProcessError) as failure:
        ahead.build(nvcc, ("90",), (bad,), out)
    assert "expected a ;" in failure.value.stderr
    assert not list(out.iterdir())


def test_the_command_line_says_when_there_is_no_nvcc(tmp_path, capsys):
    assert ahead.main(["--nvcc", str(tmp_path / "no-nvcc"), "--arch", "90"]) == 1
    assert "no " in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (a CUDA toolkit)")
def test_a_real_source_compiles_to_a_fatbin_holding_every_kernel_by_name(tmp_path):
    pencil = ahead.ROOT / "pencil" / "pencil.cu"
    (fatbin,) = ahead.build("nvcc", ("90",), (pencil,), tmp_path)
    names = re.findall(r'_k\("(\w+)"', (ahead.ROOT / "pencil" / "cuda.py").read_text())  # what the launcher asks for
    assert len(names) >= 10
    data = fatbin.read_bytes()
    assert all(name.encode() in data for name in names), [n for n in names if n.encode() not in data]
