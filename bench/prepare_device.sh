#!/usr/bin/env bash
# Builds, on this (networked) machine, what a GPU session carries to the offline device:
#   .whl/  wheels the device lacks, at the versions of locks/cuda13.txt and locks/test.txt
#          (the web stack, nvImageCodec, pytest-xdist...), for the GPU tests and the benchmarks;
#   .whlv/ PyAV's wheel (and py-spy's), for the video steps (carry it instead of .whl: both pass 64 MiB);
#   .whlc/ imagecodecs' wheel, installed by a first call of its own (see below);
#   .rg/   Debian's ripgrep and its libpcre2, for bench/search.py's host anchor.
# All are kept out of git (.git/info/exclude). Then a first call installs imagecodecs:
#   carry [".whlc"], command: bash bench/gpu_session.sh codecs-install
# and each later call on the still-warm machine carries the rest:
#   carry [".whl", ".rg"], command: bash bench/gpu_session.sh stencil-tests cs256-tests search-tests ...
# Usage, from the project root: bash bench/prepare_device.sh
set -euo pipefail
[ -f pyproject.toml ] || { echo "run from the project root" >&2; exit 2; }
mkdir -p .git/info
for ignored in /.whl/ /.whlv/ /.whlc/ /.rg/; do
  grep -qx "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude
done
# The wheels come at the versions of the locks (locks/cuda13.txt and locks/test.txt, for
# Python 3.12 on Linux x86_64), so the GPU tests run what users install. Left out: what the
# device's image holds already (NumPy, SciPy, OpenCV, Pillow, CuPy, scikit-image, ... at its
# own versions, too large to carry: gpu_session.sh logs both) and what a GPU run never loads.
device_has=" numpy scipy opencv-python-headless opencv-python pillow cupy-cuda13x cupy-cuda12x torch triton
 scikit-image imageio tifffile networkx lazy-loader nvidia-ml-py cuda-pathfinder nvidia-nvjpeg
 ruff mypy mypy-extensions librt import-linter grimp kubernetes-validate playwright greenlet ast-serialize "
wanted=$(mktemp)
python3 locks/pins.py --python 3.12.3 --skip "$device_has" locks/cuda13.txt locks/test.txt > "$wanted"
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_27_x86_64 --platform any -d .whl -r "$wanted" 2>&1 | grep -v "is ignored" || true
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "py-spy>=0.3" 2>&1 | grep -v "is ignored" || true
rm -f "$wanted"
# PyAV (36 MB) beside nvImageCodec (25 MB) would pass what one device call carries (64 MiB):
# it goes to .whlv/, carried alone for the video steps (the server loads it only for a clip).
# py-spy rides with it too, for bench/video.py --gil-profile.
rm -rf .whlv && mkdir -p .whlv && mv .whl/av-*.whl .whlv/ && mv .whl/py_spy-*.whl .whlv/
# imagecodecs (28 MB, the PNG decode of uploads) would push .whl past 64 MiB too: it goes to
# .whlc/, carried by a first call of its own (`bash bench/gpu_session.sh codecs-install`), which
# installs it in /tmp/sitec; later calls on the same warm machine find it there.
rm -rf .whlc && mkdir -p .whlc && mv .whl/imagecodecs-*.whl .whlc/
work=$(mktemp -d)
(cd "$work" && apt-get download ripgrep libpcre2-8-0 >/dev/null)
for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/root"; done
rm -rf .rg && mkdir -p .rg
cp "$work/root/usr/bin/rg" .rg/
cp -P "$work"/root/usr/lib/x86_64-linux-gnu/libpcre2-8.so* .rg/
rm -rf "$work"
version=$(LD_LIBRARY_PATH=$PWD/.rg .rg/rg --version)
echo "${version%%$'\n'*} in .rg/"
du -sh .whl .whlv .whlc .rg 2>/dev/null || true
