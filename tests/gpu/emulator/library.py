"""Builds and calls the CPU emulation of CUDA kernels (emu.h beside this file): a kernel
source compiled by the host's g++ into a shared library with one C entry point,
emu_launch, called through ctypes. Used by tests/gpu/search and tests/gpu/cs256.

    path = build(driver_cpp, {"SEARCH_SOURCE": search_cu}, cache_dir)   # or pytest.skip
    launch(ctypes.CDLL(path), "kernel_name", grid, block, shared_bytes, args)

Kernel arguments are NumPy arrays (passed as pointers) or NumPy scalars of the kernel's
exact C type, as with CuPy; a size mismatch is an error.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
HEADER = HERE / "emu.h"
PROBE = (
    "#include <barrier>\n#include <atomic>\nint main() { std::barrier<> b(1); unsigned x = 0; "
    "std::atomic_ref<unsigned>(x).fetch_add(1); b.arrive_and_wait(); }\n"
)


class NoCompiler(Exception):
    """No g++ with C++20's std::barrier and std::atomic_ref (GCC 11 or newer)."""


def build(driver: Path, sources: dict[str, Path], cache_dir: Path, work_dir: Path) -> Path:
    """The emulator library of `driver` (a .cpp including emu.h and the kernel source named
    by the macro in `sources`), built once per content of the three (kept in cache_dir).
    Raises NoCompiler; AssertionError with g++'s message when the source does not build."""
    compiler = shutil.which("g++")
    if compiler is None:
        raise NoCompiler("no g++ to build the CUDA emulator")
    (work_dir / "probe.cpp").write_text(PROBE)
    if subprocess.run(
        [compiler, "-std=c++20", "-pthread", str(work_dir / "probe.cpp"), "-o", str(work_dir / "probe")],
        check=False,
        capture_output=True,
        timeout=120,
    ).returncode:
        raise NoCompiler(f"{compiler} has no C++20 std::barrier / std::atomic_ref (GCC 11 or newer needed)")
    parts = [HEADER, driver, *sources.values()]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()[:16]
    built = Path(cache_dir) / f"lib{driver.stem}-{digest}.so"
    if not built.exists():
        partial = work_dir / built.name
        defines = [f'-D{name}="{path}"' for name, path in sources.items()]
        done = subprocess.run(
            [
                compiler,
                "-std=c++20",
                "-O1",
                "-fPIC",
                "-shared",
                "-pthread",
                f"-I{HERE}",
                *defines,
                str(driver),
                "-o",
                str(partial),
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"{driver.name} does not build in the emulator:\n{done.stderr[-6000:]}"
        # Copied beside its final name, then renamed: a test worker of pytest-xdist building
        # the same library at the same time never loads a half-written file.
        staged = built.with_name(f"{built.name}.{os.getpid()}.partial")
        shutil.copyfile(partial, staged)
        os.replace(staged, built)
    return built


def build_in_pytest(request, tmp_path_factory, driver: Path, sources: dict[str, Path]) -> Path:
    """`build` for a module-scoped fixture: kept in pytest's cache between runs (a scratch
    folder under -p no:cacheprovider); the test is skipped without a suitable g++."""
    import pytest

    work = tmp_path_factory.mktemp(f"{driver.stem}-emulator")
    pytest_cache = getattr(request.config, "cache", None)
    cache = pytest_cache.mkdir("cuda-emulator") if pytest_cache is not None else work
    try:
        return build(driver, sources, cache, work)
    except NoCompiler as exc:
        pytest.skip(str(exc))


def load(path: Path | str) -> ctypes.CDLL:
    library = ctypes.CDLL(str(path))
    if hasattr(library, "emu_launch_dims"):  # EMU_DIMS_ENTRY_POINT
        library.emu_launch_dims.restype = ctypes.c_int
        library.emu_launch_dims.argtypes = [
            ctypes.c_char_p,
            *[ctypes.c_uint] * 7,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_int,
        ]
    if not hasattr(library, "emu_launch"):
        return library
    library.emu_launch.restype = ctypes.c_int
    library.emu_launch.argtypes = [
        ctypes.c_char_p,
        ctypes.c_uint,
        ctypes.c_uint,
        ctypes.c_uint,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_int,
    ]
    return library


def launch(library: ctypes.CDLL, name: str, grid: int, block: int, shared_bytes: int, args) -> None:
    """Runs kernel `name` on a 1-D grid of 1-D blocks to its end."""
    pointers, sizes, _holders = _arguments(name, args)  # the holders live until the call returns
    status = library.emu_launch(name.encode(), grid, block, shared_bytes, pointers, sizes, len(args))
    if status != 0:
        raise RuntimeError(f"emu_launch({name}) returned {status}")


def launch_dims(library: ctypes.CDLL, name: str, grid: tuple, block: tuple, shared_bytes: int, args) -> None:
    """Runs kernel `name` on a grid of blocks given as CuPy takes them, (x,), (x, y) or
    (x, y, z), to its end (a driver built with emu.h's EMU_DIMS_ENTRY_POINT)."""
    grid3, block3 = (*grid, 1, 1)[:3], (*block, 1, 1)[:3]
    pointers, sizes, _holders = _arguments(name, args)  # the holders live until the call returns
    status = library.emu_launch_dims(name.encode(), *grid3, *block3, shared_bytes, pointers, sizes, len(args))
    if status != 0:
        raise RuntimeError(f"emu_launch_dims({name}) returned {status}")


def _arguments(name: str, args):
    """ctypes (pointers, sizes) of the kernel arguments, and the holders to keep alive."""
    count = len(args)
    keep, pointers, sizes = [], (ctypes.c_void_p * count)(), (ctypes.c_int * count)()
    for k, arg in enumerate(args):
        if isinstance(arg, np.ndarray):
            holder = ctypes.c_void_p(arg.ctypes.data)
            pointers[k] = ctypes.cast(ctypes.pointer(holder), ctypes.c_void_p)
            sizes[k] = 8
        elif isinstance(arg, np.generic):
            holder = ctypes.create_string_buffer(arg.tobytes(), arg.itemsize)
            pointers[k] = ctypes.cast(holder, ctypes.c_void_p)
            sizes[k] = arg.itemsize
        else:
            raise TypeError(
                f"{name}: argument {k} is a {type(arg).__name__}; pass arrays or NumPy scalars of the kernel's types"
            )
        keep.append(holder)
    return pointers, sizes, keep


# `extern __shared__ T name[];`: the block's dynamic shared memory, which the emulator
# hands out as shared_base() (a `static` array cannot be `extern`).
DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+([A-Za-z_][\w\s]*?)\s+(\w+)\s*\[\s*\]\s*;")


def with_dynamic_shared(source: Path, work_dir: Path) -> Path:
    """A copy of the CUDA source `source` (in work_dir) whose `extern __shared__ T name[];`
    declarations read `T* name = reinterpret_cast<T*>(shared_base());`, for a kernel source
    that does not guard them with CUDA_EMULATION itself. Everything else is as written."""
    text, count = DYNAMIC_SHARED.subn(r"\1* \2 = reinterpret_cast<\1*>(shared_base());", source.read_text())
    assert count, f"{source} declares no dynamic shared memory"
    copy = Path(work_dir) / source.name
    copy.write_text(text)
    return copy
