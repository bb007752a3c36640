# syntax=docker/dockerfile:1
#
# pencil-gpu: photos to pencil drawings, served over HTTP, on an NVIDIA GPU when
# one is visible to the container and on the CPU otherwise.
#
#   docker build -t pencil-gpu .
#   docker run --gpus all -p 8000:8000 -v pencil-data:/data pencil-gpu   # GPU
#   docker run            -p 8000:8000 -v pencil-data:/data pencil-gpu   # CPU only
#
# Base image: the CUDA *runtime* flavour, not devel (no nvcc, no static libs,
# several GiB smaller); only the builder stage has the toolkit, to compile our
# kernels ahead of time (gpu/ahead.py: fatbins for sm_80, 86, 89, 90 and PTX).
# What CuPy (cupy-cuda12x, the `cuda` extra) needs at run time, and where each
# piece comes from:
#   * libcuda.so (driver API): from the host driver, mounted in by the NVIDIA
#     container toolkit. Without it CuPy reports no device and the app falls
#     back to its CPU backend, so the same image runs on GPU-less hosts.
#   * libcudart, libnvrtc (+ libnvrtc-builtins), cuBLAS, cuFFT, cuRAND,
#     cuSOLVER, cuSPARSE: shipped by this image (its `cuda-libraries-12-6`
#     package) under /usr/local/cuda/lib64, found by the dynamic loader. CuPy compiles
#     its own elementwise/reduction kernels at run time with NVRTC (ours come
#     compiled, and NVRTC compiles them where a GPU is not in the fatbins), so NVRTC is
#     essential; it is present here, so the large pip NVRTC/cuBLAS wheels
#     (`cupy-cuda12x[ctk]`, `nvidia-cuda-nvrtc-cu12`) are NOT installed.
#   * CUDA runtime *headers* (vector_types.h, cuda_fp16.h, ...): since CUDA 12.2
#     NVRTC needs them to compile CuPy's kernels (otherwise every kernel fails
#     with NVRTC_ERROR_COMPILATION: cannot open source file "vector_types.h"),
#     and the runtime image has none. CuPy's install guide says to add them
#     with `pip install "nvidia-cuda-runtime-cu12==12.X.*"`, 12.X being the
#     CUDA version in use; CuPy (via cuda-pathfinder) finds them in the venv's
#     site-packages. A < 1 MiB wheel, simpler than adding cuda-cudart-dev-12-6
#     from NVIDIA's apt repo. The RawModules built from gpu/**/*.cu need these
#     headers too. Their minor version must match the image's NVRTC, hence
#     locks/cuda12.txt pins them to CUDA_VERSION's minor (CUDA_HEADERS in
#     locks/refresh.sh; tests/deploy/test_locks.py checks the two agree).
#   * libnvjpeg: nvImageCodec (the `cuda` extra) decodes and encodes JPEG on
#     the GPU with it; the image's runtime libraries include it, and the
#     extra's [nvjpeg] wheel is the fallback.
# Served fast by default: PENCIL_PROCESSES=0 runs three server processes for
# every four cores, and PENCIL_MPS=auto puts them under a private CUDA MPS
# daemon (nvidia-cuda-mps-control comes with the driver utilities the NVIDIA
# container toolkit mounts); when MPS cannot start, the log says so and the
# processes time-slice the GPU. MALLOC_TOP_PAD_ keeps glibc from returning the
# PNG encoder's buffers to the kernel after each request (6.0 -> 5.3 ms a 1080p
# drawing measured).
# Host driver: one that supports CUDA 12.6 (>= 560), or an older branch that
# the base image's NVIDIA_REQUIRE_CUDA accepts (set NVIDIA_DISABLE_REQUIRE=1 at
# run time to rely on CUDA 12 minor-version compatibility with R525+). GPUs
# newer than Hopper (sm_100/sm_120) need CUDA >= 12.8: bump CUDA_VERSION and
# CUDA_HEADERS in locks/refresh.sh together, then refresh the locks.

ARG CUDA_VERSION=12.6.3
ARG CUDA_IMAGE=nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
# The builder has the CUDA toolkit of the same version: nvcc compiles the kernels ahead.
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04

# ---------------------------------------------------------------- builder ---
FROM ${CUDA_DEVEL_IMAGE} AS builder

ARG DEBIAN_FRONTEND=noninteractive
# Ubuntu 24.04 ships Python 3.12 (the package needs >= 3.11).
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/venv

# Exactly the versions CI tested: the lock of the `cuda` and `postgres` extras, every wheel
# checked against its sha256 (locks/refresh.sh makes it; its nvidia-cuda-runtime-cu12 is of
# CUDA_VERSION's minor, see the header comment). The lock is its own layer: a code change does
# not reinstall the dependencies.
WORKDIR /src
COPY locks/cuda12.txt locks/
RUN /opt/venv/bin/pip install --no-cache-dir --require-hashes -r locks/cuda12.txt
COPY . .
# Every CUDA source compiled ahead (gpu/ahead.py): a fatbin beside each .cu, with machine code
# for the A100, A10, L4/L40 and H100/H200 generations and PTX for later GPUs, installed with
# the package. No server process compiles our kernels, on any start of any container.
RUN python3 -m gpu.ahead --nvcc /usr/local/cuda/bin/nvcc \
    && /opt/venv/bin/pip install --no-cache-dir --no-deps .

# ---------------------------------------------------------------- runtime ---
FROM ${CUDA_IMAGE} AS runtime

ARG DEBIAN_FRONTEND=noninteractive
# Only the interpreter: the venv is copied in ready-made (its python symlinks
# to /usr/bin/python3, the same package as in the builder stage).
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*

# Unprivileged user. The Ubuntu 24.04 base already has `ubuntu` at uid 1000,
# so use a fixed high uid/gid. /data is created and owned by it so that a
# fresh named volume mounted there inherits the ownership.
RUN groupadd --system --gid 10001 pencil \
    && useradd --system --uid 10001 --gid pencil --create-home \
        --home-dir /home/pencil --shell /usr/sbin/nologin pencil \
    && mkdir -p /data \
    && chown pencil:pencil /data

COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:${PATH} \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PENCIL_HOST=0.0.0.0 \
    PENCIL_PORT=8000 \
    PENCIL_DATA_DIR=/data \
    PENCIL_PROCESSES=0 \
    PENCIL_MPS=auto \
    MALLOC_TOP_PAD_=16777216

# Numeric uid:gid (DL3066) so that runtimes that check for a non-root user
# (e.g. Kubernetes runAsNonRoot) can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /home/pencil

EXPOSE 8000

# No curl in the image: probe with the venv's Python and urllib. It targets
# port 8000 on purpose, the port the CMD below binds, whatever PENCIL_PORT says
# (compose uses PENCIL_PORT as the *host* port).
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["/opt/venv/bin/python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"]

CMD ["pencil-gpu", "serve", "--host", "0.0.0.0", "--port", "8000"]
