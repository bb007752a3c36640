#!/usr/bin/env bash
# Refresh the dependency locks (locks/*.txt) to what PyPI held at a date, then run the suite
# against them: upgrading what users install is a deliberate, tested step.
#
#   bash locks/refresh.sh [YYYY-MM-DD]        # default: today (UTC)
#   bash locks/refresh.sh --check-only        # the suite against the locks as they are
#   bash locks/refresh.sh --lock-only [DATE]  # the locks only (then run the suite yourself)
#
# Each lock is one universal resolution (uv pip compile --universal, every distribution's
# sha256), for Python >= 3.11 on every platform, with a fork where a package dropped 3.11
# (PyAV 19, NumPy 2.5): pip installs it with `pip install --require-hashes -r locks/X.txt`,
# then the project itself with `pip install --no-deps .`. All locks are resolved as of the
# same instant (--exclude-newer), so wherever two of them hold a package they hold the same
# version (tests/deploy/test_locks.py checks it).
#
#   cpu.txt     the package and its PostgreSQL job store: `pip install .` on a CPU host
#   cuda12.txt  the Docker image: CUDA 12 extra, PostgreSQL, and the CUDA runtime headers
#               NVRTC needs, of the image's CUDA minor (CUDA_HEADERS below, kept in step with
#               the Dockerfile's CUDA_VERSION)
#   cuda13.txt  the CUDA 13 extra and PostgreSQL: `pip install .` on a CUDA 13 host
#   test.txt    the test extra (the gates, pytest, PostgreSQL): the README's Tests, and CI
#
# After a refresh the suite runs with every Python found among python3.11 and python3.12 (CI
# runs both); on a machine with an NVIDIA GPU the GPU tests (pytest -m gpu) run too, with
# cuda13.txt installed over test.txt. Elsewhere, run them on a GPU machine before landing:
# bench/gpu_session.sh gpu-tests installs the locked versions there.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9                        # the resolver; a new one may resolve differently
CUDA_HEADERS="nvidia-cuda-runtime-cu12==12.6.*"  # the Dockerfile's CUDA_VERSION is 12.6
PYTHONS=(python3.11 python3.12)         # the Pythons we test: CI's and the image's

check_only=0
lock_only=0
case "${1:-}" in
  --check-only) check_only=1 && shift ;;
  --lock-only) lock_only=1 && shift ;;
esac
date=${1:-$(date -u +%Y-%m-%d)}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "$check_only" = 0 ]; then
  python3 -m venv "$work/uv"
  "$work/uv/bin/pip" install -q "uv==$UV_VERSION"
  echo "$CUDA_HEADERS" > "$work/cuda12-headers.in"
  compile() {  # compile LOCK [uv pip compile arguments...]
    local lock=$1
    shift
    "$work/uv/bin/uv" pip compile pyproject.toml "$@" --universal --python-version 3.11 \
      --exclude-newer "${date}T00:00:00Z" --generate-hashes --quiet \
      --custom-compile-command "bash locks/refresh.sh $date" -o "locks/$lock"
    echo "locks/$lock: $(grep -c '^[a-z0-9]' "locks/$lock") packages"
  }
  compile cpu.txt --extra postgres
  compile cuda12.txt --extra cuda --extra postgres "$work/cuda12-headers.in"
  compile cuda13.txt --extra cuda13 --extra postgres
  compile test.txt --extra test
  [ "$lock_only" = 0 ] || exit 0
fi

# The suite against the locks, on each Python we test, as the README's Tests say.
ran=0
for python in "${PYTHONS[@]}"; do
  interpreter=$(command -v "$python" || true)
  [ -n "$interpreter" ] && "$interpreter" -c pass 2>/dev/null || { echo "== $python: not found, skipped"; continue; }
  echo "== the suite on $("$interpreter" --version)"
  "$interpreter" -m venv "$work/$python"
  (
    . "$work/$python/bin/activate"
    pip install -q --require-hashes -r locks/test.txt
    pip install -q --no-deps .
    ruff check . && ruff format --check . && mypy && lint-imports && pytest -q
    if nvidia-smi -L >/dev/null 2>&1; then
      echo "== the GPU tests on $python, with locks/cuda13.txt"
      pip install -q --require-hashes -r locks/cuda13.txt
      pytest -q -m gpu
    fi
  )
  ran=$((ran + 1))
done
[ "$ran" -gt 0 ] || { echo "no Python to test with (${PYTHONS[*]})" >&2; exit 1; }
nvidia-smi -L >/dev/null 2>&1 || echo "== no GPU here: run bench/gpu_session.sh gpu-tests on a GPU machine before landing"
