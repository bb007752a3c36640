#!/usr/bin/env bash
# Everything the pencil GPU work needs measured, in one call on the GPU machine: the GPU
# tests, compute-sanitizer on every kernel path, the benchmark. Logs go to $OUT (or
# /tmp/pencil-gpu). Wheels of the web stack (.whl/, from ../shared/tools/wheelhouse.sh)
# are installed first when present: the end-to-end benchmark needs them.
#   bash bench/gpu_session.sh [tests] [sanitize] [bench] [e2e] [draw-tests] [codecs] [phases] [e2e-mps] [svd-tests] [svd-bench] [svd-sanitize]
#        [stencil-tests] [stencil-sanitize] [stencil-bench] [cs256-tests] [cs256-sanitize] [cs256-bench]
#        [search-tests] [search-sanitize] [search-bench] [scale] [live] [video] [ahead] [start]    (default: the first four)
# A ripgrep binary (and its libpcre2) carried in .rg/ is used by search-bench; bench/prepare_device.sh
# builds .whl/ and .rg/ on the developer machine.
# SVD_SIZES and STENCIL_SHAPES pick the sizes of svd-bench and stencil-bench.
# scale (bench/scale.py: 1 then 2 replicas, a GPU each, behind nginx) uses the nginx carried in .ngx/
# (bench/prepare_nginx.sh); SCALE_ARGS: more options of bench/scale.py. live: bench/live.py, LIVE_ARGS its options.
# video (the GPU video tests and bench/video.py) needs PyAV: carry .whlv/ (bench/prepare_device.sh).
# codecs-install: a first call carrying .whlc/ alone installs imagecodecs (the uploads' PNG decode)
# in /tmp/sitec, where the later calls on the warm machine find it (.whl with it passes 64 MiB).
set -uo pipefail
out=${OUT:-/tmp/pencil-gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  web=(); for w in .whl/*.whl; do case $w in *nvimgcodec*) ;; *) web+=("$w") ;; esac; done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${web[@]}" || exit 1
  # nvImageCodec joins the `nvidia` namespace of the installed CUDA wheels, so it goes where they are.
  if compgen -G ".whl/nvidia_nvimgcodec*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-cache-dir .whl/nvidia_nvimgcodec*.whl 2>/dev/null \
      || python3 -m pip install -q --no-index --no-deps --no-cache-dir --user .whl/nvidia_nvimgcodec*.whl \
      || python3 -m pip install -q --no-index --no-deps --no-cache-dir --break-system-packages .whl/nvidia_nvimgcodec*.whl
  fi
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD
fi
if compgen -G ".whlc/*.whl" > /dev/null; then  # imagecodecs, carried alone (bench/prepare_device.sh)
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/sitec .whlc/*.whl || exit 1
fi
if [ -d /tmp/sitec ]; then  # installed by an earlier call on this machine
  export PYTHONPATH=/tmp/sitec:$PYTHONPATH
elif [ "${*:-}" != codecs-install ]; then
  echo "imagecodecs is not installed here: run 'bash bench/gpu_session.sh codecs-install' carrying .whlc first" >&2
fi
if compgen -G ".whlv/*.whl" > /dev/null; then  # PyAV, for the video steps (bench/prepare_device.sh)
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/sitev .whlv/*.whl || exit 1
  export PYTHONPATH=/tmp/sitev:$PYTHONPATH PATH=/tmp/sitev/bin:$PATH
fi
steps=${*:-tests sanitize bench e2e}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$out/device.txt"
# What runs here against the locks (the device's own NumPy, CuPy... are not carried: too large).
python3 locks/pins.py --installed locks/cuda13.txt locks/test.txt >> "$out/device.txt" 2>&1 || true
tail -1 "$out/device.txt"
for step in $steps; do
  case $step in
    tests) python3 -m pytest -q -m gpu tests -p no:cacheprovider -x 2>&1 | tee "$out/gpu-tests.log" | tail -25 ;;
    ahead)
      # The image's way: every kernel compiled ahead (gpu/ahead.py) for this GPU, then all the GPU tests on the fatbins.
      arch=$(python3 -c "import cupy; print(cupy.cuda.Device(0).compute_capability)")
      python3 -m gpu.ahead --arch "$arch" 2>&1 | tee "$out/ahead.log"
      python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tee -a "$out/ahead.log" | tail -25 ;;
    start)
      # bench/start.py: the shipped server from a fresh start and a restart to /readyz, first sketch and first jobs.
      # START_ARGS: its options (--processes, --env, --kinds ...). Run `ahead` first for the image's fatbins.
      python3 bench/start.py ${START_ARGS:-} --out "$out/start" 2>&1 | tee "$out/start.log" | tail -20 ;;
    sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --print-limit 20 python3 bench/sanitize_pencil.py 2>&1 | tee "$out/sanitize-$tool.log" | tail -6
      done ;;
    bench) python3 bench/pencil.py --backend cuda 2>&1 | tee "$out/bench.log" ;;
    svd-tests) python3 -m pytest -q -m gpu tests/gpu/svd tests/app/jobs/test_api_cuda.py -p no:cacheprovider --maxfail=10 2>&1 | tee "$out/svd-tests.log" | tail -40 ;;
    svd-bench) python3 bench/svd.py --sizes "${SVD_SIZES:-1024x1024,2048x2048,4096x4096,8192x512}" 2>&1 | tee "$out/svd-bench.log" ;;
    svd-sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --print-limit 20 python3 -m pytest -q -m gpu tests/gpu/svd/test_cuda.py -p no:cacheprovider -k "shapes and 65 or chunks or zeros" 2>&1 | tee "$out/svd-sanitize-$tool.log" | tail -6
      done ;;
    stencil-tests) python3 -m pytest -q -m gpu tests/gpu/stencil tests/app/jobs/test_stencil.py -p no:cacheprovider --maxfail=10 2>&1 | tee "$out/stencil-tests.log" | tail -40 ;;
    stencil-sanitize)
      compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -m gpu tests/gpu/stencil/test_cuda.py -k no_write -p no:cacheprovider 2>&1 | tee "$out/stencil-sanitize-memcheck.log" | tail -6
      compute-sanitizer --tool racecheck --print-limit 20 python3 -m pytest -q -m gpu tests/gpu/stencil/test_cuda.py -k "no_write and shared" -p no:cacheprovider 2>&1 | tee "$out/stencil-sanitize-racecheck.log" | tail -6 ;;
    stencil-bench) python3 bench/stencil.py --shapes "${STENCIL_SHAPES:-1024x256x256,2048x256x256,4096x256x256,7168x256x256,512x512x512}" 2>&1 | tee "$out/stencil-bench.log" ;;
    cs256-tests) python3 -m pytest -q -m gpu tests/gpu/cs256 tests/app/jobs/test_cs256.py -p no:cacheprovider --maxfail=10 2>&1 | tee "$out/cs256-tests.log" | tail -40 ;;
    cs256-sanitize)
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --print-limit 20 python3 -m pytest -q -m gpu tests/gpu/cs256/test_cuda.py -p no:cacheprovider -x -k "spmv or spmm" 2>&1 | tee "$out/cs256-sanitize-$tool.log" | tail -6
      done ;;
    cs256-bench) python3 bench/cs256.py 2>&1 | tee "$out/cs256-bench.log" ;;
    search-tests) python3 -m pytest -q -m gpu tests/gpu/search tests/app/jobs/test_search.py tests/app/test_corpora.py -p no:cacheprovider --maxfail=10 2>&1 | tee "$out/search-tests.log" | tail -40 ;;
    search-sanitize)
      compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -m gpu tests/gpu/search/test_cuda.py -p no:cacheprovider -k "auto_runs or newline or fused" 2>&1 | tee "$out/search-sanitize-memcheck.log" | tail -6
      compute-sanitizer --tool racecheck --print-limit 20 python3 bench/sanitize_search.py 2>&1 | tee "$out/search-sanitize-racecheck.log" | tail -6 ;;
    search-bench)
      if [ -x .rg/rg ]; then rg_flag=(--rg "$PWD/.rg/rg"); export LD_LIBRARY_PATH=$PWD/.rg:${LD_LIBRARY_PATH:-}; else rg_flag=(); fi
      python3 bench/search.py "${rg_flag[@]}" 2>&1 | tee "$out/search-bench.log" ;;
    draw-tests) python3 -m pytest -q -m gpu tests/gpu/pencil/test_draw_cuda.py tests/app/test_sketch_cuda.py tests/gpu/pencil/test_cuda.py -p no:cacheprovider --maxfail=10 2>&1 | tee "$out/draw-tests.log" | tail -30 ;;
    phases) python3 bench/draw_phases.py 2>&1 | grep -v "nvjpeg2k\|nvtiff\|Note: If" | tee "$out/phases.log" ;;
    codecs) python3 -c "from nvidia import nvimgcodec; print('nvImageCodec', nvimgcodec.__version__)" 2>&1 | tail -3 | tee "$out/codecs.log" ;;
    codecs-install) python3 -c "import imagecodecs; print('imagecodecs', imagecodecs.__version__)" 2>&1 | tee "$out/codecs-install.log" ;;
    e2e)
      # E2E_SETTINGS: space-separated 'name:KEY=V,KEY=V' (each restarts the server); E2E_ARGS: more options.
      settings=(); for s in ${E2E_SETTINGS:-}; do settings+=(--setting "$s"); done  # none: the shipped defaults
      python3 bench/pencil.py --e2e --backend cuda "${settings[@]}" ${E2E_ARGS:-} --out "$out" 2>&1 | tee "$out/e2e.log" | tail -60 ;;
    video) python3 -m pytest -q -m gpu tests/gpu/video -p no:cacheprovider 2>&1 | tee "$out/video-tests.log" | tail -5
      python3 bench/video.py --backend cuda --gil-profile "$out/video-gil" 2>&1 | tee "$out/video.log" | tail -30 ;;
    live) python3 bench/live.py ${LIVE_ARGS:-} --out "$out" 2>&1 | tee "$out/live.log" | tail -40 ;;
    scale) python3 bench/scale.py ${SCALE_ARGS:-} --out "$out" 2>&1 | tee "$out/scale.log" | tail -40 ;;
    e2e-mps)
      # The same under CUDA MPS (kernels of the server processes run side by side, not time-sliced).
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      if nvidia-cuda-mps-control -d; then
        settings=(); for s in ${E2E_MPS_SETTINGS:-mps8:PENCIL_PROCESSES=8}; do settings+=(--setting "$s"); done
        python3 bench/pencil.py --e2e --backend cuda "${settings[@]}" ${E2E_ARGS:-} --out "$out" 2>&1 | tee "$out/e2e-mps.log" | tail -40
        echo quit | nvidia-cuda-mps-control
      else
        echo "MPS: nvidia-cuda-mps-control -d failed" | tee "$out/e2e-mps.log"
      fi
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY ;;
  esac
done
