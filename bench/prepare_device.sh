#!/usr/bin/env bash
# Builds, on this (networked) machine, what a GPU session carries to the offline device:
#   .whl/  wheels of the web stack the device lacks (../shared/tools/wheelhouse.sh), for the
#          HTTP GPU tests and the end-to-end benchmark;
#   .whlv/ PyAV's wheel (and py-spy's), for the video steps (carry it instead of .whl: both pass 64 MiB);
#   .rg/   Debian's ripgrep and its libpcre2, for bench/search.py's host anchor.
# Both are kept out of git (.git/info/exclude). Then one device call, carrying both:
#   carry [".whl", ".rg"], command: bash bench/gpu_session.sh stencil-tests cs256-tests search-tests ...
# Usage, from the project root: bash bench/prepare_device.sh
set -euo pipefail
[ -f pyproject.toml ] || { echo "run from the project root" >&2; exit 2; }
mkdir -p .git/info
for ignored in /.whl/ /.whlv/ /.rg/; do
  grep -qx "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude
done
if [ -x ../shared/tools/wheelhouse.sh ] || [ -f ../shared/tools/wheelhouse.sh ]; then
  # nvImageCodec (the device JPEG codecs) and py-spy (bench/e2e.py --profile) ride along.
  bash ../shared/tools/wheelhouse.sh "nvidia-nvimgcodec-cu13>=0.9" "py-spy>=0.3"
  # PyAV (36 MB) beside nvImageCodec (25 MB) would pass what one device call carries (64 MiB):
  # it goes to .whlv/, carried alone for the video steps (the server loads it only for a clip).
  # py-spy rides with it too, for bench/video.py --gil-profile.
  rm -rf .whlv && mkdir -p .whlv && mv .whl/av-*.whl .whlv/ && cp .whl/py_spy-*.whl .whlv/
else
  echo "no ../shared/tools/wheelhouse.sh: .whl/ not built (the HTTP GPU tests will skip)" >&2
fi
work=$(mktemp -d)
(cd "$work" && apt-get download ripgrep libpcre2-8-0 >/dev/null)
for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/root"; done
rm -rf .rg && mkdir -p .rg
cp "$work/root/usr/bin/rg" .rg/
cp -P "$work"/root/usr/lib/x86_64-linux-gnu/libpcre2-8.so* .rg/
rm -rf "$work"
version=$(LD_LIBRARY_PATH=$PWD/.rg .rg/rg --version)
echo "${version%%$'\n'*} in .rg/"
du -sh .whl .whlv .rg 2>/dev/null || true
