# aotc Triton kernel prelude: helpers shared by every generated kernel (copied into each kernel
# source, so that a kernel file is self-contained). Semantics follow torch and the C++ prelude.
import triton
import triton.language as tl
from triton.language.extra import libdevice  # noqa: F401 - kernels call it


@triton.jit
def aotc_maximum(a, b):
    # NaN-propagating maximum (torch.maximum, amax); also the combine function of max reductions
    return tl.where((a != a) | (a > b), a, b)


@triton.jit
def aotc_minimum(a, b):
    return tl.where((a != a) | (a < b), a, b)


@triton.jit
def aotc_add(a, b):
    return a + b


@triton.jit
def aotc_mul(a, b):
    return a * b


@triton.jit
def aotc_argmax(a, ai, b, bi):
    # (value, index) combine: NaN wins, then the larger value, then the smaller index
    an = a != a
    bn = b != b
    better = (a > b) | (an & (bn == 0))
    tie = (a == b) | (an & bn)
    pick = better | (tie & (ai < bi))
    return tl.where(pick, a, b), tl.where(pick, ai, bi)


@triton.jit
def aotc_argmin(a, ai, b, bi):
    an = a != a
    bn = b != b
    better = (a < b) | (an & (bn == 0))
    tie = (a == b) | (an & bn)
    pick = better | (tie & (ai < bi))
    return tl.where(pick, a, b), tl.where(pick, ai, bi)


@triton.jit
def aotc_remainder(a, b):
    # Python's modulo: the result takes the sign of the divisor
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def aotc_floordiv_int(a, b):
    q = a // b
    return tl.where(((a % b) != 0) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def aotc_floordiv_fp(a, b):
    # torch's c10::div_floor_floating: from fmod, so 1 / 0.1 still floors to the true result
    mod = a % b
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    fl = tl.where(div == 0, 0.0 * (a / b), fl)
    return tl.where(b == 0, a / b, fl)


@triton.jit
def aotc_ipow(a, b):
    # integer power by squaring (64 steps cover every int64 exponent); negative exponents as C++
    x = b * 0 + a          # both operands as blocks of one shape (either may be a constant)
    exp = a * 0 + b
    base, e, r = x, exp, x * 0 + 1
    for _ in range(64):
        r = tl.where((e & 1) != 0, r * base, r)
        base = base * base
        e = e >> 1
    neg = tl.where(x == 1, 1, tl.where(x == -1, tl.where((exp & 1) != 0, -1, 1), 0))
    return tl.where(exp < 0, neg.to(r.dtype), r)
