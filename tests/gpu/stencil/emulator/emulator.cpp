// A CPU emulation of gpu/stencil/stencil.cu for the CPU test suite (tests/gpu/stencil/
// test_emulated.py): the real kernel source compiled by g++ with the few CUDA features it
// uses supplied here. It checks what a GPU run alone would otherwise show:
//
// - every global load is bounds-checked against the launch's arrays; every store must hit
//   an interior point of pp (2 <= x, y, z <= n-3), and each interior point is written
//   exactly once per launch; the CPML's stores (zeta in the stencil kernels, psi in
//   cpml_psi) must hit their array, each cell exactly once per launch; the first offence
//   is reported with the thread and block;
// - one fiber (ucontext) per CUDA thread; __syncthreads switches fibers, so barriers
//   really separate the block's phases. A barrier reached while other threads of the
//   block have exited is reported (the kernels keep barriers block-uniform);
// - the threads of a block run in forward, reverse or shuffled order between barriers:
//   a shared-memory race (a thread reading what another writes in the same phase) makes
//   the result depend on the order, which the tests compare;
// - __shared__ arrays live in one linker section, filled with NaN before every block: a
//   read of shared memory not written in this block poisons the result;
// - float arithmetic is IEEE single with round-to-nearest and no contraction
//   (-ffp-contract=off, SSE), as __fadd_rn / __fmul_rn / __fdiv_rn on the GPU.
//
// C ABI (ctypes): emulate(...) runs one launch; see its comment.

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

// ------------------------------------------------------------- the CUDA shim --

struct uint3 {
    unsigned x, y, z;
};

static uint3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static __attribute__((section("stencil_smem")))

extern "C" char __start_stencil_smem[];  // bounds of the section, from the GNU linker
extern "C" char __stop_stencil_smem[];

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

namespace emu {

struct Range {
    const float* lo;
    const float* hi;
};

static Range readable[6];
static int readables = 0;
static float* out = nullptr;  // pp
static int nx = 0, ny = 0, nz = 0;
static std::vector<unsigned char> writes;  // stores per point of pp
static float* state = nullptr;  // the CPML's zeta or psi: `cells` floats, each stored once
static long long cells = 0;
static std::vector<unsigned char> state_writes;
static std::string error;  // the first offence

static void offence(const char* what, const float* a) {
    if (!error.empty()) return;
    char text[256];
    std::snprintf(text, sizeof text, "%s at %p: thread (%u, %u) of block (%u, %u, %u)", what, static_cast<const void*>(a), threadIdx.x, threadIdx.y, blockIdx.x, blockIdx.y,
                  blockIdx.z);
    error = text;
}

static float read(const float* a) {
    for (int k = 0; k < readables; ++k) {
        if (a >= readable[k].lo && a < readable[k].hi) return *a;
    }
    offence("load outside the arrays", a);
    return std::numeric_limits<float>::quiet_NaN();
}

static void write(float* a, float v) {
    if (state != nullptr && a >= state && a < state + cells) {
        if (++state_writes[a - state] > 1) offence("CPML cell stored twice", a);
        *a = v;
        return;
    }
    const long long i = a - out, plane = static_cast<long long>(nx) * ny;
    if (i < 0 || i >= plane * nz) {
        offence("store outside pp", a);
        return;
    }
    const long long z = i / plane, y = i % plane / nx, x = i % nx;
    if (x < 2 || x > nx - 3 || y < 2 || y > ny - 3 || z < 2 || z > nz - 3) {
        offence("store outside the interior", a);
        return;
    }
    if (++writes[i] > 1) offence("interior point stored twice", a);
    *a = v;
}

}  // namespace emu

inline float __ldg(const float* a) { return emu::read(a); }
inline float __ldcg(const float* a) { return emu::read(a); }
inline float __ldcs(const float* a) { return emu::read(a); }
inline void __stcs(float* a, float v) { emu::write(a, v); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }

void __syncthreads();

#include STENCIL_SOURCE

// ------------------------------------------------------------ the scheduler --

namespace emu {

constexpr int STACK = 1 << 16;

enum State { RUNNABLE, AT_BARRIER, DONE };

struct Fiber {
    ucontext_t context;
    State state;
    unsigned x, y;
};

static ucontext_t scheduler;
static std::vector<Fiber> fibers;
static std::vector<std::vector<char>> stacks;
static int current = -1;
static void (*body)() = nullptr;  // the launch, bound to its arguments

static void entry() {
    body();
    fibers[current].state = DONE;  // returns to the scheduler through uc_link
}

static void run_block(int threads, unsigned bx, unsigned by, unsigned tz, int order, unsigned seed) {
    std::fill(reinterpret_cast<float*>(__start_stencil_smem), reinterpret_cast<float*>(__stop_stencil_smem), std::numeric_limits<float>::quiet_NaN());
    fibers.assign(threads, Fiber{});
    stacks.resize(threads);
    for (int t = 0; t < threads; ++t) {
        stacks[t].resize(STACK);
        Fiber& f = fibers[t];
        f.state = RUNNABLE;
        f.x = t % blockDim.x;
        f.y = t / blockDim.x;
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = stacks[t].data();
        f.context.uc_stack.ss_size = STACK;
        f.context.uc_link = &scheduler;
        makecontext(&f.context, entry, 0);
    }
    blockIdx = {bx, by, tz};
    std::vector<int> sequence(threads);
    unsigned state = seed * 2654435761u + bx * 97u + by * 13u + tz + 1u;
    for (;;) {
        for (int t = 0; t < threads; ++t) sequence[t] = order == 1 ? threads - 1 - t : t;
        if (order == 2) {  // a shuffle per phase
            for (int t = threads - 1; t > 0; --t) {
                state = state * 1664525u + 1013904223u;
                std::swap(sequence[t], sequence[(state >> 8) % (t + 1)]);
            }
        }
        for (int t : sequence) {
            if (fibers[t].state != RUNNABLE) continue;
            current = t;
            threadIdx = {fibers[t].x, fibers[t].y, 0};
            swapcontext(&scheduler, &fibers[t].context);
        }
        int waiting = 0, done = 0;
        for (const Fiber& f : fibers) {
            waiting += f.state == AT_BARRIER;
            done += f.state == DONE;
        }
        if (done == threads) return;
        if (done > 0) {
            if (error.empty()) error = "__syncthreads reached while other threads of the block have exited (block " + std::to_string(bx) + ")";
            return;  // the waiting fibers are abandoned: their stacks are reset next block
        }
        for (Fiber& f : fibers) f.state = RUNNABLE;
    }
}

}  // namespace emu

void __syncthreads() {
    emu::fibers[emu::current].state = emu::AT_BARRIER;
    swapcontext(&emu::fibers[emu::current].context, &emu::scheduler);
}

// ------------------------------------------------------------------ the ABI --

using Kernel = void (*)(const float*, float*, const float*, int, int, int, int, int, int, int, int, int, int, float, float, const float*, const float*, float*, int);

#define ENTRY(NAME) {#NAME, NAME}
static const struct {
    const char* name;
    Kernel kernel;
} KERNELS_TABLE[] = {
    ENTRY(stencil_naive), ENTRY(stencil_naive_int_z), ENTRY(stencil_naive_int_z_reg), ENTRY(stencil_shared), ENTRY(stencil_shared_int_z), ENTRY(stencil_shared_int_z_reg),
    ENTRY(stencil_readonly), ENTRY(stencil_readonly_int_z), ENTRY(stencil_readonly_int_z_reg), ENTRY(stencil_naive_sponge), ENTRY(stencil_naive_int_z_sponge),
    ENTRY(stencil_naive_int_z_reg_sponge), ENTRY(stencil_shared_sponge), ENTRY(stencil_shared_int_z_sponge), ENTRY(stencil_shared_int_z_reg_sponge),
    ENTRY(stencil_readonly_sponge), ENTRY(stencil_readonly_int_z_sponge), ENTRY(stencil_readonly_int_z_reg_sponge), ENTRY(stencil_naive_cpml),
    ENTRY(stencil_naive_int_z_cpml), ENTRY(stencil_naive_int_z_reg_cpml), ENTRY(stencil_shared_cpml), ENTRY(stencil_shared_int_z_cpml), ENTRY(stencil_shared_int_z_reg_cpml),
    ENTRY(stencil_readonly_cpml), ENTRY(stencil_readonly_int_z_cpml), ENTRY(stencil_readonly_int_z_reg_cpml),
};

struct Arguments {
    Kernel kernel;
    const float* p;
    float* pp;
    const float* c;
    int ints[10];
    float amp, eta_max;
    const float* ramps;
    const float* psi;
    float* zeta;
    int width;
};
static Arguments launch_args;

static void call() {
    const Arguments& a = launch_args;
    a.kernel(a.p, a.pp, a.c, a.ints[0], a.ints[1], a.ints[2], a.ints[3], a.ints[4], a.ints[5], a.ints[6], a.ints[7], a.ints[8], a.ints[9], a.amp, a.eta_max, a.ramps, a.psi, a.zeta, a.width);
}

// The CPML's check after a launch: every cell of `state` stored exactly once.
static void check_state() {
    for (long long k = 0; k < emu::cells && emu::error.empty(); ++k) {
        if (emu::state_writes[k] != 1) emu::error = "CPML cell " + std::to_string(k) + " not written";
    }
}

static void use_state(float* state, long long cells) {
    emu::state = state;
    emu::cells = state == nullptr ? 0 : cells;
    emu::state_writes.assign(emu::cells, 0);
}

// One launch of kernel `name` on a grid (gx, gy, gz) of 32 x 8 threads. p, pp, c: `points`
// floats each; ramps: `ramp_count` floats (or null: the sponge's ramps or the CPML's
// profile). CPML kernels: psi and zeta, `cells` floats each, and the width (else null, 0).
// ints: the kernel's 10 integer arguments (nx, ny, nz, tiles_x, tiles_a, za, zb, sx, sy,
// sz). order: 0 forward, 1 reverse, 2 shuffled (seed) between barriers. Returns 0, or 1
// with the first offence in `message`, 2 for an unknown kernel, 3 if nx ny nz != points.
extern "C" int emulate(const char* name, const float* p, float* pp, const float* c, long long points, const float* ramps, long long ramp_count, const float* psi, float* zeta,
                       long long cells, int width, const int* ints, float amp, float eta_max, int gx, int gy, int gz, int order, unsigned seed, char* message,
                       int message_size) {
    Kernel kernel = nullptr;
    for (const auto& entry : KERNELS_TABLE) {
        if (std::strcmp(entry.name, name) == 0) kernel = entry.kernel;
    }
    if (kernel == nullptr) return 2;
    emu::error.clear();
    emu::readables = 0;
    emu::readable[emu::readables++] = {p, p + points};
    emu::readable[emu::readables++] = {pp, pp + points};
    emu::readable[emu::readables++] = {c, c + points};
    if (ramps != nullptr) emu::readable[emu::readables++] = {ramps, ramps + ramp_count};
    if (psi != nullptr) emu::readable[emu::readables++] = {psi, psi + cells};
    if (zeta != nullptr) emu::readable[emu::readables++] = {zeta, zeta + cells};
    use_state(zeta, cells);
    emu::out = pp;
    emu::nx = ints[0];
    emu::ny = ints[1];
    emu::nz = ints[2];
    if (static_cast<long long>(emu::nx) * emu::ny * emu::nz != points) return 3;
    emu::writes.assign(points, 0);
    launch_args = {kernel, p, pp, c, {}, amp, eta_max, ramps == nullptr ? c : ramps, psi == nullptr ? c : psi, zeta == nullptr ? pp : zeta, width};
    std::memcpy(launch_args.ints, ints, sizeof launch_args.ints);
    emu::body = call;
    blockDim = {32, 8, 1};
    gridDim = {static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(gz)};
    for (int z = 0; z < gz && emu::error.empty(); ++z) {
        for (int y = 0; y < gy && emu::error.empty(); ++y) {
            for (int x = 0; x < gx && emu::error.empty(); ++x) emu::run_block(32 * 8, x, y, z, order, seed);
        }
    }
    if (emu::error.empty()) {  // every interior point written (once)
        const long long plane = static_cast<long long>(emu::nx) * emu::ny;
        for (long long i = 0; i < points && emu::error.empty(); ++i) {
            const long long z = i / plane, y = i % plane / emu::nx, x = i % emu::nx;
            const bool interior = x >= 2 && x <= emu::nx - 3 && y >= 2 && y <= emu::ny - 3 && z >= 2 && z <= emu::nz - 3;
            if (interior && emu::writes[i] != 1) emu::error = "interior point (" + std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(z) + ") not written";
        }
    }
    if (emu::error.empty()) check_state();
    use_state(nullptr, 0);
    if (emu::error.empty()) return 0;
    std::snprintf(message, message_size, "%s", emu::error.c_str());
    return 1;
}

static struct {
    const float* p;
    float* psi;
    const float* profile;
    int nx, ny, nz, width;
} psi_args;

static void call_psi() {
    const auto& a = psi_args;
    cpml_psi(a.p, a.psi, a.profile, a.nx, a.ny, a.nz, a.width);
}

// One launch of cpml_psi on `blocks` blocks of 256 threads: p (nx ny nz floats), psi
// (`cells`), profile (2 (nx + ny + nz)). Returns 0, or 1 with the first offence in `message`.
extern "C" int emulate_psi(const float* p, float* psi, long long cells, const float* profile, int nx, int ny, int nz, int width, int blocks, char* message, int message_size) {
    emu::error.clear();
    emu::readables = 0;
    const long long points = static_cast<long long>(nx) * ny * nz;
    emu::readable[emu::readables++] = {p, p + points};
    emu::readable[emu::readables++] = {psi, psi + cells};
    emu::readable[emu::readables++] = {profile, profile + 2 * (nx + ny + nz)};
    use_state(psi, cells);
    emu::out = nullptr;  // no store outside psi is allowed
    emu::nx = emu::ny = emu::nz = 0;
    psi_args = {p, psi, profile, nx, ny, nz, width};
    emu::body = call_psi;
    blockDim = {256, 1, 1};
    gridDim = {static_cast<unsigned>(blocks), 1, 1};
    for (int b = 0; b < blocks && emu::error.empty(); ++b) emu::run_block(256, b, 0, 0, 0, 0);
    if (emu::error.empty()) check_state();
    use_state(nullptr, 0);
    if (emu::error.empty()) return 0;
    std::snprintf(message, message_size, "%s", emu::error.c_str());
    return 1;
}
