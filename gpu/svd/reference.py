"""Golub-Reinsch SVD as in Lahabar & Narayanan (2009), in NumPy: the definition of correct.

A = U S V^T for a real m x n matrix, m >= n (a wide matrix is done as its transpose):

1. Bidiagonalization B = Q^T A P by Householder reflectors, blocked as in the paper (and
   LAPACK's dgebrd/dlabrd): a panel of L columns is eliminated with the left reflectors
   H_i = I - tau u u^T and right reflectors G_i = I - tau v v^T applied only to the rows
   and columns the panel needs, keeping for each i the vectors u, v, z = tau A^T u and
   w = tau (A - u z^T) v (A as updated so far): H A G = A - u z^T - w v^T. The trailing
   matrix then gets one rank-2L update A -= U Z^T + W V^T.
   Q and P are accumulated explicitly, a panel at a time (compact WY: I - Y T Y^T).
2. Diagonalization S = X^T B Y by implicitly shifted QR (Golub-Kahan with the refinements
   of Demmel & Kahan 1990): split at negligible e_i (relative test), Wilkinson-type shift
   from the trailing 2 x 2 (zero shift where a shift would cost relative accuracy), bulge
   chased towards the small end, 2 x 2 blocks solved directly. The Givens rotations of a
   sweep are collected and applied afterwards as one batch to the columns of U and the
   rows of V^T: the part the GPU does in parallel (one thread per element of a row).
3. U = Q X, V^T = Y^T P^T; singular values made non-negative and sorted descending.

Steps 1 and 3 are in the input dtype (float32 or float64); step 2 is in float64
(CHASE_DTYPE) for both: the bidiagonal is only 2n numbers, and a float32 chase loses
accuracy that the float32 bidiagonalization keeps (on a graded 1500 x 1200 float32 matrix:
2.3e-6 of s_max against the 3.6e-7 its float32 bidiagonal allows). The rotations are
rounded to the input dtype as they are applied to U and V^T. `svd` also offers LAPACK
(numpy.linalg.svd) as the fast CPU path; `accuracy` gives LAPACK's test ratios.
"""

from __future__ import annotations

import time

import numpy as np

from gpu.svd.params import SvdParams, check_matrix, resolve_method

CHASE_DTYPE = np.dtype(np.float64)  # the precision of the bidiagonal QR (step 2)

# -------------------------------------------------------------------- input checks --


# -------------------------------------------------------------- bidiagonalization --


def _norm(x: np.ndarray):
    """2-norm scaled by max |x_i|, so that squaring cannot overflow (float32 above ~1e19)."""
    scale = np.max(np.abs(x)) if x.size else x.dtype.type(0)
    if scale == 0:
        return scale
    y = x / scale
    return scale * np.sqrt(np.dot(y, y))


def householder(x: np.ndarray) -> tuple[np.ndarray, np.floating, np.floating]:
    """Reflector H = I - tau v v^T with H x = beta e_1, v[0] = 1; (v, tau, beta), dtype of x.

    beta = -sign(x_0) ||x|| so that x_0 - beta does not cancel (the paper's equations 6-8).
    tau = 0 (H = I) when x is already a multiple of e_1.
    """
    v = np.zeros_like(x)
    v[0] = 1
    alpha = x[0]
    rest = _norm(x[1:])
    if rest == 0:
        return v, x.dtype.type(0), alpha
    beta = -np.copysign(np.hypot(alpha, rest), alpha)
    v[1:] = x[1:] / (alpha - beta)
    return v, (beta - alpha) / beta, beta


def _wy_factor(vectors: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """T (k, k) upper triangular with H_1 H_2 ... H_k = I - Y T Y^T, Y = vectors (rows, k)."""
    k = taus.shape[0]
    t = np.zeros((k, k), vectors.dtype)
    for i in range(k):
        t[:i, i] = -taus[i] * (t[:i, :i] @ (vectors[:, :i].T @ vectors[:, i]))
        t[i, i] = taus[i]
    return t


def bidiagonalize(a: np.ndarray, block_size: int = 32, vectors: str = "thin"):
    """Upper bidiagonal B = Q^T A P of an (m, n) matrix with m >= n: (q, d, e, pt).

    d (n,) and e (n-1,) are the diagonal and superdiagonal of B; q is Q's first n columns
    (m, n) for vectors="thin", all of Q (m, m) for "full"; pt = P^T (n, n). vectors="none"
    returns q = pt = None (the paper's partial bidiagonalization). Same dtype as `a`.
    """
    m, n = a.shape
    if m < n:
        raise ValueError(f"bidiagonalize needs m >= n, got {m} x {n}: pass the transpose")
    if vectors not in ("thin", "full", "none"):
        raise ValueError(f"vectors must be thin, full or none; got {vectors!r}")
    dtype = a.dtype
    work = np.array(a, dtype=dtype, order="F")  # columns are read and written most
    d = np.zeros(n, dtype)
    e = np.zeros(max(n - 1, 0), dtype)
    # Reflector vectors in place: left[i:, i] = u_i (u_i[0] = 1), right[i+1:, i] = v_i.
    left, tau_left = np.zeros((m, n), dtype), np.zeros(n, dtype)
    right, tau_right = np.zeros((n, n), dtype), np.zeros(n, dtype)

    for p in range(0, n, block_size):
        nb = min(block_size, n - p)
        u, v = left[:, p : p + nb], right[:, p : p + nb]  # views: rows indexed like A
        z, w = np.zeros((n, nb), dtype), np.zeros((m, nb), dtype)
        # Within the panel A is not updated: the current matrix is work - u z^T - w v^T,
        # and only the column and row about to be eliminated are brought up to date.
        for i in range(nb):
            c = p + i
            work[c:, c] -= u[c:, :i] @ z[c, :i] + w[c:, :i] @ v[c, :i]
            u[c:, i], tau_left[c], d[c] = householder(work[c:, c])
            if c == n - 1:
                break
            col = u[c:, i]
            z[c + 1 :, i] = tau_left[c] * (
                work[c:, c + 1 :].T @ col - z[c + 1 :, :i] @ (u[c:, :i].T @ col) - v[c + 1 :, :i] @ (w[c:, :i].T @ col)
            )
            work[c, c + 1 :] -= z[c + 1 :, : i + 1] @ u[c, : i + 1] + v[c + 1 :, :i] @ w[c, :i]
            v[c + 1 :, i], tau_right[c], e[c] = householder(work[c, c + 1 :])
            row = v[c + 1 :, i]
            w[c + 1 :, i] = tau_right[c] * (
                work[c + 1 :, c + 1 :] @ row
                - u[c + 1 :, : i + 1] @ (z[c + 1 :, : i + 1].T @ row)
                - w[c + 1 :, :i] @ (v[c + 1 :, :i].T @ row)
            )
        t = p + nb
        work[t:, t:] -= u[t:] @ z[t:].T + w[t:] @ v[t:].T  # the rank-2L update of the block

    if vectors == "none":
        return None, d, e, None
    # Q = H_0 H_1 ... H_{n-1} I and P = G_0 ... G_{n-2}, built from the last panel back so
    # that each panel's product I - Y T Y^T only touches the trailing rows and columns.
    q = np.eye(m, n if vectors == "thin" else m, dtype=dtype)
    p_mat = np.eye(n, dtype=dtype)
    for p in reversed(range(0, n, block_size)):
        nb = min(block_size, n - p)
        y = left[p:, p : p + nb]
        q[p:, p:] -= y @ (_wy_factor(y, tau_left[p : p + nb]) @ (y.T @ q[p:, p:]))
        y = right[p + 1 :, p : p + nb]
        p_mat[p + 1 :, p + 1 :] -= y @ (_wy_factor(y, tau_right[p : p + nb]) @ (y.T @ p_mat[p + 1 :, p + 1 :]))
    return np.ascontiguousarray(q), d, e, np.ascontiguousarray(p_mat.T)


# ---------------------------------------------------------------- diagonalization --


def givens(f, g):
    """(c, s, r) with [c s; -s c] [f; g] = [r; 0], in the dtype of f and g."""
    if g == 0:
        return f.dtype.type(1), f.dtype.type(0), f
    if f == 0:
        return f.dtype.type(0), g.dtype.type(1), g
    r = np.hypot(f, g)
    return f / r, g / r, r


def apply_rotations(rows: np.ndarray, first: np.ndarray, c: np.ndarray, s: np.ndarray) -> None:
    """Rotate pairs of rows in place, in the given order: for k = 0, 1, ..., with j = first[k],
    row_j <- c_k row_j + s_k row_{j+1}, row_{j+1} <- c_k row_{j+1} - s_k row_j.

    Each rotation needs the previous one's result, but every column is independent: the
    GPU kernel gives each thread one column and walks the rotations. For U, pass U^T.
    c and s are rounded to the dtype of `rows` first."""
    c, s = c.astype(rows.dtype), s.astype(rows.dtype)
    for j, ck, sk in zip(first.tolist(), c, s, strict=True):
        x = rows[j].copy()
        rows[j] = ck * x + sk * rows[j + 1]
        rows[j + 1] = ck * rows[j + 1] - sk * x


def _sweep(d: np.ndarray, e: np.ndarray, shift):
    """One implicit QR sweep, top to bottom, on the upper bidiagonal (d, e) in place.

    Returns the rotations ((c_right, s_right), (c_left, s_left)), rotation k acting on
    columns (resp. rows) k, k+1: B <- L^T B R, to be applied as V^T <- R^T V^T, U <- U L.
    shift == 0 is Demmel & Kahan's zero-shift sweep, which keeps tiny singular values
    accurate to full relative precision.
    """
    k = e.shape[0]
    cr, sr, cl, sl = (np.empty(k, d.dtype) for _ in range(4))
    one = d.dtype.type(1)
    if shift == 0:
        c, old_c, old_s = one, one, d.dtype.type(0)
        for i in range(k):
            c, s, r = givens(d[i] * c, e[i])
            if i > 0:
                e[i - 1] = old_s * r
            old_c, old_s, d[i] = givens(old_c * r, d[i + 1] * s)
            cr[i], sr[i], cl[i], sl[i] = c, s, old_c, old_s
        h = d[k] * c
        d[k], e[k - 1] = h * old_c, h * old_s
        return (cr, sr), (cl, sl)
    # The first rotation is that of the QR step on B^T B - shift^2 I (first column
    # (d_0^2 - shift^2, d_0 e_0), divided by d_0); the rest chase the bulge down.
    f = (abs(d[0]) - shift) * (np.copysign(one, d[0]) + shift / d[0])
    g = e[0]
    for i in range(k):
        c, s, r = givens(f, g)
        if i > 0:
            e[i - 1] = r
        f = c * d[i] + s * e[i]
        e[i] = c * e[i] - s * d[i]
        g = s * d[i + 1]
        d[i + 1] = c * d[i + 1]
        cr[i], sr[i] = c, s
        c, s, r = givens(f, g)
        d[i] = r
        f = c * e[i] + s * d[i + 1]
        d[i + 1] = c * d[i + 1] - s * e[i]
        if i < k - 1:
            g = s * e[i + 1]
            e[i + 1] = c * e[i + 1]
        cl[i], sl[i] = c, s
    e[k - 1] = f
    return (cr, sr), (cl, sl)


def smallest_singular_value_2x2(f, g, h):
    """The smaller singular value of [[f, g], [0, h]], without overflow or cancellation.

    From s_min * s_max = |f h| and s_max = (sqrt((|f| + |h|)^2 + g^2) + sqrt((|f| - |h|)^2 + g^2)) / 2,
    with every square scaled by the largest of |f|, |g|, |h|."""
    fa, ga, ha = abs(f), abs(g), abs(h)
    lo, hi = min(fa, ha), max(fa, ha)
    if lo == 0:
        return lo
    plus, minus = 1 + lo / hi, (hi - lo) / hi
    if ga < hi:
        ratio = (ga / hi) ** 2
        return lo * (2 / (np.sqrt(plus * plus + ratio) + np.sqrt(minus * minus + ratio)))
    ratio = hi / ga
    if ratio == 0:  # g so large that hi / g underflows
        return (lo * hi) / ga
    return 2 * (lo * ratio / (np.sqrt(1 + (plus * ratio) ** 2) + np.sqrt(1 + (minus * ratio) ** 2)))


def svd_2x2(f, g, h):
    """SVD of the upper triangular [[f, g], [0, h]]: (left, right, s1, s2) with left, right
    (2, 2) rotations and left^T [[f, g], [0, h]] right = diag(s1, s2), in the dtype of f.

    A rotation first makes the block symmetric, then the symmetric Jacobi rotation
    diagonalizes it (Brent, Luk & Van Loan). s1, s2 may be negative and in either order."""
    one, zero = f.dtype.type(1), f.dtype.type(0)
    # [c s; -s c]^T [[f, g], [0, h]] is symmetric for tan(phi) = g / (f + h)
    r = np.hypot(f + h, g)
    c1, s1 = (one, zero) if r == 0 else ((f + h) / r, g / r)
    p, q, t = c1 * f, s1 * f, s1 * g + c1 * h  # the symmetric [[p, q], [q, t]]
    if q == 0:
        c2, s2, tan = one, zero, zero
    else:
        with np.errstate(over="ignore"):  # zeta overflowing gives tan = 0, right to working precision
            zeta = (t - p) / (2 * q)
            tan = np.copysign(one, zeta) / (abs(zeta) + np.hypot(one, zeta))
        c2 = one / np.hypot(one, tan)
        s2 = tan * c2
    right = np.array([[c2, s2], [-s2, c2]], f.dtype)
    left = np.array([[c1, s1], [-s1, c1]], f.dtype) @ right
    return left, right, p - tan * q, t + tan * q


# Relative tolerance of the convergence tests, in ulp. LAPACK's dbdsqr takes eps^(-1/8) ulp
# (about 90 in double) to save sweeps, but an e_i dropped at that size perturbs B by up to
# that many ulp of its norm: zero-shift sweeps (linear convergence) gave residual ratios
# of 18 on 5 x 5 bidiagonals, against 2.6 at most with 10 ulp.
TOLERANCE_ULP = 10
# The tolerance of the float64 chase for each input dtype: a float32 matrix's singular
# values need converge only to its own precision, one float32 ulp (a relative perturbation
# below the float32 rounding of the result): 18-53% fewer rotations than 10 float64 ulp
# (gaussian n = 1024, clustered n = 1200), the same errors.
CHASE_TOLERANCE = {
    np.dtype(np.float32): float(np.finfo(np.float32).eps),
    np.dtype(np.float64): TOLERANCE_ULP * float(np.finfo(np.float64).eps),
}


def bidiagonal_svd(
    d: np.ndarray,
    e: np.ndarray,
    u: np.ndarray | None = None,
    vt: np.ndarray | None = None,
    max_sweeps: int | None = None,
    tol: float | None = None,
):
    """SVD of the upper bidiagonal B (diagonal d (n,), superdiagonal e (n-1,)): (s, u, vt).

    B = X diag(s) Y^T; u's first n columns are replaced by u X and vt's rows by Y^T vt, in
    place (either may be None: values only). s (n,) is non-negative and descending, with
    the vectors in the same order. The arithmetic is in d's dtype (`svd` passes float64:
    CHASE_DTYPE); u and vt may be of another, the rotations are rounded to theirs. At most
    max_sweeps QR sweeps (default 30 n), else numpy.linalg.LinAlgError. tol: the relative
    tolerance of the convergence tests (default TOLERANCE_ULP ulp of d's dtype).
    """
    d, e = np.array(d), np.array(e, dtype=np.asarray(d).dtype)
    n = d.shape[0]
    dtype = d.dtype
    eps = dtype.type(np.finfo(dtype).eps)
    tol = dtype.type(TOLERANCE_ULP) * eps if tol is None else dtype.type(tol)
    max_sweeps = 30 * n if max_sweeps is None else max_sweeps
    ut = None if u is None else u.T  # U's columns are rotated as the rows of U^T

    # e_i below thresh is negligible outright: tol times a lower bound on the smallest
    # singular value (Demmel & Kahan's recurrence), floored above underflow.
    mu = smin = abs(d[0])
    for i in range(1, n):
        if smin == 0:
            break
        mu = abs(d[i]) * (mu / (mu + abs(e[i - 1])))
        smin = min(smin, mu)
    thresh = max(tol * smin / dtype.type(np.sqrt(n)), dtype.type(6 * n * n) * np.finfo(dtype).tiny)

    hi, sweeps, old, forward = n - 1, 0, (-1, -1), True
    while hi > 0:
        # the unreduced block lo..hi at the bottom of what is left
        lo, smax = hi, abs(d[hi])
        while lo > 0 and abs(e[lo - 1]) > thresh:
            lo -= 1
            smax = max(smax, abs(d[lo]), abs(e[lo]))
        if lo > 0:
            e[lo - 1] = 0
        if lo == hi:  # d[hi] has converged
            hi -= 1
            continue
        if lo == hi - 1:
            left, right, d[lo], d[hi] = svd_2x2(d[lo], e[lo], d[hi])
            e[lo] = 0
            if vt is not None:
                vt[lo : hi + 1] = right.T.astype(vt.dtype) @ vt[lo : hi + 1]
            if ut is not None:
                ut[lo : hi + 1] = left.T.astype(ut.dtype) @ ut[lo : hi + 1]
            hi -= 2
            continue
        if lo > old[1] or hi < old[0]:  # a new block: chase the bulge towards its smaller end
            forward = abs(d[lo]) >= abs(d[hi])
        # A bottom-to-top sweep on B is a top-to-bottom one on the reversed transpose, so
        # the tests and the sweep run on reversed views, and left and right swap roles.
        dd, ee = (d[lo : hi + 1], e[lo:hi]) if forward else (d[lo : hi + 1][::-1], e[lo:hi][::-1])

        # relative convergence tests (Demmel & Kahan): e_k is negligible next to a lower
        # bound mu on the smallest singular value of the leading k+1 rows
        if abs(ee[-1]) <= tol * abs(dd[-1]):
            ee[-1] = 0
            continue
        mu = smin = abs(dd[0])
        split = False
        for k in range(ee.shape[0]):
            if abs(ee[k]) <= tol * mu:
                ee[k], split = 0, True
                break
            mu = abs(dd[k + 1]) * (mu / (mu + abs(ee[k])))
            smin = min(smin, mu)
        if split:
            continue

        if sweeps >= max_sweeps:
            raise np.linalg.LinAlgError(
                f"bidiagonal QR did not converge in {max_sweeps} sweeps ({hi + 1} singular values left)"
            )
        old = (lo, hi)
        # Shifting by about the smallest singular value would swamp tiny ones: zero shift
        if n * tol * (smin / smax) <= max(eps, tol / 100):
            shift = dtype.type(0)
        else:
            shift = smallest_singular_value_2x2(dd[-2], ee[-1], dd[-1])
            if (shift / abs(dd[0])) ** 2 < eps:
                shift = dtype.type(0)
        (c_right, s_right), (c_left, s_left) = _sweep(dd, ee, shift)
        sweeps += 1

        # the sweep's rotations, as a batch (k-th rotation: pair first[k], first[k] + 1)
        steps = np.arange(hi - lo)
        if forward:
            first, to_vt, to_u = lo + steps, (c_right, s_right), (c_left, s_left)
        else:  # reversed: the pair turns around, so the sine changes sign
            first, to_vt, to_u = hi - 1 - steps, (c_left, -s_left), (c_right, -s_right)
        if vt is not None:
            apply_rotations(vt, first, *to_vt)
        if ut is not None:
            apply_rotations(ut, first, *to_u)
        if abs(ee[-1]) <= thresh:
            ee[-1] = 0

    negative = d < 0
    d[negative] = -d[negative]
    if vt is not None:
        vt[negative] = -vt[negative]
    order = np.argsort(-d, kind="stable")
    d = d[order]
    if vt is not None:
        vt[:] = vt[order]
    if ut is not None:
        ut[:n] = ut[order]
    return d, u, vt


# ----------------------------------------------------------------------- the SVD --


def svd(a: np.ndarray, params: SvdParams | None = None, timings: dict[str, float] | None = None):
    """A = U diag(s) V^T: (u, s, vt) in the dtype of `a`, s descending and non-negative.

    a: (m, n) float32 or float64, checked by `check_matrix`. With k = min(m, n), u is
    (m, k) and vt (k, n), or (m, m) and (n, n) with params.full_matrices; u and vt are None
    unless params.compute_uv. method "auto" is LAPACK, the fast path on the CPU.
    timings: if given, the milliseconds of each phase are added to it.
    """
    params = params or SvdParams()
    timings = {} if timings is None else timings
    a = check_matrix(a)
    start = time.perf_counter()
    if resolve_method(params, a.shape, a.dtype, on_gpu=False) == "lapack":
        if not params.compute_uv:
            s = np.linalg.svd(a, compute_uv=False)
            timings["lapack"] = (time.perf_counter() - start) * 1000
            return None, s, None
        u, s, vt = np.linalg.svd(a, full_matrices=params.full_matrices)
        timings["lapack"] = (time.perf_counter() - start) * 1000
        return u, s, vt
    m, n = a.shape
    vectors = "full" if params.full_matrices else "thin"
    q, d, e, pt = bidiagonalize(a.T if m < n else a, params.block_size, vectors if params.compute_uv else "none")
    timings["bidiagonalization"] = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    s, u, vt = bidiagonal_svd(d.astype(CHASE_DTYPE), e.astype(CHASE_DTYPE), q, pt, tol=CHASE_TOLERANCE[a.dtype])
    s = s.astype(a.dtype)
    timings["diagonalization"] = (time.perf_counter() - start) * 1000
    if not params.compute_uv:
        return None, s, None
    if m < n:  # A^T = U S V^T
        u, vt = vt.T, u.T
    return np.ascontiguousarray(u), s, np.ascontiguousarray(vt)


ACCURACY_BLOCK_BYTES = 1 << 27  # float64 bytes of A's columns `accuracy` converts at a time


def accuracy(a, u, s, vt, xp=np) -> dict[str, float]:
    """LAPACK's SVD test ratios in float64, with ulp the machine epsilon of s's dtype and the
    thin factors (k = len(s) columns of u, rows of vt); O(1) means as accurate as the precision allows:
    resid = ||A - U S V^T||_1 / (||A||_1 max(m, n) ulp), orth_u = ||I - U^T U||_1 / (m ulp),
    orth_v = ||I - V^T V||_1 / (n ulp) (V^T V computed as vt vt^T). xp: the array module
    of the arrays (numpy, or cupy for device arrays: the products run on the device)."""
    ulp = float(np.finfo(s.dtype).eps)
    m, n = a.shape
    k = s.shape[0]
    u64, vt64 = (xp.asarray(x, xp.float64) for x in (u[:, :k], vt[:k]))
    us = u64 * xp.asarray(s, xp.float64)

    def norm1(x) -> float:  # the largest column sum of |x|
        return float(xp.abs(x).sum(axis=0).max())

    # A and A - U S V^T a block of columns at a time: whole, their float64 copies held
    # several times A's size more on the device than the job's SVD itself
    width = max(1, ACCURACY_BLOCK_BYTES // (8 * m))
    residual = a_norm = 0.0
    for first in range(0, n, width):
        columns = xp.asarray(a[:, first : first + width], xp.float64)
        a_norm = max(a_norm, norm1(columns))
        residual = max(residual, norm1(columns - us @ vt64[:, first : first + width]))
    if a_norm > 0:
        resid = residual / (a_norm * max(m, n) * ulp)
    else:
        resid = 0.0 if residual == 0 else 1.0 / ulp
    eye = xp.eye(k)
    return {
        "resid": float(resid),
        "orth_u": norm1(eye - u64.T @ u64) / (m * ulp),
        "orth_v": norm1(eye - vt64 @ vt64.T) / (n * ulp),
    }
