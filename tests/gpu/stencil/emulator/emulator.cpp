// A CPU emulation of gpu/stencil/stencil.cu for the CPU test suite (tests/gpu/stencil/
// test_emulated.py): the real kernel source compiled by g++ with the few CUDA features it
// uses supplied here. It checks what a GPU run alone would otherwise show:
//
// - every global load is bounds-checked against the launch's arrays; every store must hit
//   an interior point of pp (2 <= x, y, z <= n-3), each interior point written exactly
//   once per step (begin_step .. end_step: the variant's launches, or with the CPML the
//   shell's and the inner box's); cpml_shell's stores of the next words must hit their
//   array, each word exactly once per launch; the first offence is reported with the
//   thread and block;
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
// C ABI (ctypes): begin_step / end_step around a step's launches, emulate(...) one launch of
// a variant's kernel, emulate_shell(...) one of cpml_shell; see their comments.

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

struct int4 {
    int x, y, z, w;
};

struct float2 {
    float x, y;
};

inline float2 make_float2(float x, float y) { return float2{x, y}; }

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

static Range readable[7];
static int readables = 0;
static float* out = nullptr;  // the step's whole pp (begin_step)
static int nx = 0, ny = 0, nz = 0;  // the whole grid
static std::vector<unsigned char> writes;  // stores per point of pp in this step
static float* state = nullptr;  // the CPML's next words: `cells` of them, each stored once a launch
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
        if (++state_writes[a - state] > 1) offence("CPML word stored twice", a);
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
inline unsigned __ldg(const unsigned* a) {
    float bits = emu::read(reinterpret_cast<const float*>(a));
    unsigned v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
}
inline int4 __ldg(const int4* a) {
    int4 v;
    for (int k = 0; k < 4; ++k) {
        const float bits = emu::read(reinterpret_cast<const float*>(a) + k);
        std::memcpy(reinterpret_cast<int*>(&v) + k, &bits, sizeof bits);
    }
    return v;
}
inline float2 __ldg(const float2* a) { return float2{emu::read(&a->x), emu::read(&a->y)}; }
inline void __stcs(unsigned* a, unsigned v) {
    float bits;
    std::memcpy(&bits, &v, sizeof v);
    emu::write(reinterpret_cast<float*>(a), bits);
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
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

using Kernel = void (*)(const float*, float*, const float*, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, float, float, const float*);
constexpr int INTS = 15;

#define ENTRY(NAME) {#NAME, NAME}
static const struct {
    const char* name;
    Kernel kernel;
} KERNELS_TABLE[] = {
    ENTRY(stencil_naive), ENTRY(stencil_naive_int_z), ENTRY(stencil_naive_int_z_reg), ENTRY(stencil_shared), ENTRY(stencil_shared_int_z), ENTRY(stencil_shared_int_z_reg),
    ENTRY(stencil_readonly), ENTRY(stencil_readonly_int_z), ENTRY(stencil_readonly_int_z_reg), ENTRY(stencil_naive_sponge), ENTRY(stencil_naive_int_z_sponge),
    ENTRY(stencil_naive_int_z_reg_sponge), ENTRY(stencil_shared_sponge), ENTRY(stencil_shared_int_z_sponge), ENTRY(stencil_shared_int_z_reg_sponge),
    ENTRY(stencil_readonly_sponge), ENTRY(stencil_readonly_int_z_sponge), ENTRY(stencil_readonly_int_z_reg_sponge),
};

struct Arguments {
    Kernel kernel;
    const float* p;
    float* pp;
    const float* c;
    int ints[INTS];
    float amp, eta_max;
    const float* ramps;
};
static Arguments launch_args;

static void call() {
    const Arguments& a = launch_args;
    const int* i = a.ints;
    a.kernel(a.p, a.pp, a.c, i[0], i[1], i[2], i[3], i[4], i[5], i[6], i[7], i[8], i[9], i[10], i[11], i[12], i[13], i[14], a.amp, a.eta_max, a.ramps);
}

static void use_state(unsigned* state, long long cells) {
    emu::state = reinterpret_cast<float*>(state);
    emu::cells = state == nullptr ? 0 : cells;
    emu::state_writes.assign(emu::cells, 0);
}

static int finish(char* message, int message_size) {
    for (long long k = 0; k < emu::cells && emu::error.empty(); ++k) {  // the CPML's: every word stored once
        if (emu::state_writes[k] != 1) emu::error = "CPML word " + std::to_string(k) + " not written";
    }
    use_state(nullptr, 0);
    if (emu::error.empty()) return 0;
    std::snprintf(message, message_size, "%s", emu::error.c_str());
    return 1;
}

// A step's launches write into pp (the whole grid, nx ny nz points): every store must hit an
// interior point, each interior point stored exactly once in the step (end_step checks).
extern "C" void begin_step(float* pp, int nx, int ny, int nz) {
    emu::out = pp;
    emu::nx = nx;
    emu::ny = ny;
    emu::nz = nz;
    emu::writes.assign(static_cast<size_t>(nx) * ny * nz, 0);
}

extern "C" int end_step(char* message, int message_size) {
    emu::error.clear();
    const long long plane = static_cast<long long>(emu::nx) * emu::ny, points = plane * emu::nz;
    for (long long i = 0; i < points && emu::error.empty(); ++i) {
        const long long z = i / plane, y = i % plane / emu::nx, x = i % emu::nx;
        const bool interior = x >= 2 && x <= emu::nx - 3 && y >= 2 && y <= emu::ny - 3 && z >= 2 && z <= emu::nz - 3;
        if (interior && emu::writes[i] != 1) emu::error = "interior point (" + std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(z) + ") not written";
    }
    if (emu::error.empty()) return 0;
    std::snprintf(message, message_size, "%s", emu::error.c_str());
    return 1;
}

// One launch of kernel `name` on a grid (gx, gy, gz) of 32 x 8 threads, inside a step
// (begin_step). p, pp, c: the launch's views, `points` floats each; ramps: `ramp_count`
// floats (the sponge's, or null). ints: the kernel's 15 integer arguments (geometry.Launch).
// order: 0 forward, 1 reverse, 2 shuffled (seed) between barriers. Returns 0, or 1 with the
// first offence in `message`, 2 for an unknown kernel, 3 if nx ny planes != points.
extern "C" int emulate(const char* name, const float* p, float* pp, const float* c, long long points, const float* ramps, long long ramp_count, const int* ints, float amp,
                       float eta_max, int gx, int gy, int gz, int order, unsigned seed, char* message, int message_size) {
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
    if (static_cast<long long>(ints[0]) * ints[1] * ints[2] != points) return 3;
    launch_args = {kernel, p, pp, c, {}, amp, eta_max, ramps == nullptr ? c : ramps};
    std::memcpy(launch_args.ints, ints, sizeof launch_args.ints);
    emu::body = call;
    blockDim = {32, 8, 1};
    gridDim = {static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(gz)};
    for (int z = 0; z < gz && emu::error.empty(); ++z) {
        for (int y = 0; y < gy && emu::error.empty(); ++y) {
            for (int x = 0; x < gx && emu::error.empty(); ++x) emu::run_block(32 * 8, x, y, z, order, seed);
        }
    }
    return finish(message, message_size);
}

static struct {
    const float *p, *c;
    float* pp;
    const int4* chunks;
    const float2* profile;
    const unsigned* state;
    unsigned* next;
    int nx, ny, nz, width, sx, sy, sz;
    float amp;
} shell_args;

static void call_shell() {
    const auto& a = shell_args;
    cpml_shell(a.p, a.pp, a.c, a.chunks, a.profile, a.state, a.next, a.nx, a.ny, a.nz, a.width, a.sx, a.sy, a.sz, a.amp);
}

// One launch of cpml_shell inside a step (begin_step), one block per chunk: p, pp, c (the
// whole grid), chunks (`blocks` int4), profile (2 (nx + ny + nz)), the words of the last
// step (state) and of this one (next, each stored exactly once), `cells` each. order as for
// emulate. Returns 0, or 1 with the first offence in `message`.
extern "C" int emulate_shell(const float* p, float* pp, const float* c, const int* chunks, int blocks, const float* profile, const unsigned* state, unsigned* next,
                             long long cells, int nx, int ny, int nz, int width, int sx, int sy, int sz, float amp, int order, unsigned seed, char* message,
                             int message_size) {
    emu::error.clear();
    emu::readables = 0;
    const long long points = static_cast<long long>(nx) * ny * nz;
    emu::readable[emu::readables++] = {p, p + points};
    emu::readable[emu::readables++] = {pp, pp + points};
    emu::readable[emu::readables++] = {c, c + points};
    emu::readable[emu::readables++] = {reinterpret_cast<const float*>(chunks), reinterpret_cast<const float*>(chunks) + 4LL * blocks};
    emu::readable[emu::readables++] = {profile, profile + 2 * (nx + ny + nz)};
    emu::readable[emu::readables++] = {reinterpret_cast<const float*>(state), reinterpret_cast<const float*>(state) + cells};
    use_state(next, cells);
    shell_args = {p, c, pp, reinterpret_cast<const int4*>(chunks), reinterpret_cast<const float2*>(profile), state, next, nx, ny, nz, width, sx, sy, sz, amp};
    emu::body = call_shell;
    blockDim = {32, 8, 1};
    gridDim = {static_cast<unsigned>(blocks), 1, 1};
    for (int b = 0; b < blocks && emu::error.empty(); ++b) emu::run_block(32 * 8, b, 0, 0, order, seed);
    return finish(message, message_size);
}
