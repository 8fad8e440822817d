"""What a chain's named state costs per call: a compiled function that is not inlined, called
with a named tuple of 20 arrays (the engine's `state.Chain`) against one of 10 (the
positional state of commit 50bb6a1 held 10), the same work inside.

numba passes a tuple of arrays to a function it does not inline field by field (about 7
words an array), so a call's cost grows with the number of arrays in the tuple, whether or
not the callee reads them. The two loops alternate; per-call times, and their ratio.

Run: python benchmarks/bench_chain_call.py [--repeats 4] [--calls 20000]
"""

from __future__ import annotations

import argparse
import os
import time
from collections import namedtuple

import numba
import numpy as np

jit = numba.njit(nogil=True, error_model="numpy")
Wide = namedtuple("Wide", " ".join(f"f{i}" for i in range(20)))  # type: ignore[misc]
Narrow = namedtuple("Narrow", " ".join(f"f{i}" for i in range(10)))  # type: ignore[misc]


@jit
def work(ch, k):
    """Branches and a loop over two of the arrays: big enough that LLVM keeps the call."""
    x, y = ch.f0, ch.f1
    t = 0.0
    for i in range(8):
        if x[(i + k) % x.size] > y[i]:
            t += x[i] * y[(i * 3 + k) % y.size]
        else:
            t -= x[i]
        for j in range(3):
            if t > 1e300:
                t = np.sqrt(t) + j
    x[k % x.size] += 1e-9
    return t


@numba.njit(inline="always")
def view_wide(s, c):
    return Wide(s.f0[c], s.f1[c], s.f2[c], s.f3[c], s.f4[c], s.f5[c], s.f6[c], s.f7[c],
                s.f8[c], s.f9[c], s.f10[c], s.f11[c], s.f12[c], s.f13[c], s.f14[c], s.f15[c],
                s.f16[c], s.f17[c], s.f18[c], s.f19[c])  # fmt: skip


@numba.njit(inline="always")
def view_narrow(s, c):
    return Narrow(s.f0[c], s.f1[c], s.f2[c], s.f3[c], s.f4[c], s.f5[c], s.f6[c], s.f7[c],
                  s.f8[c], s.f9[c])  # fmt: skip


@jit
def loop_wide(s, reps):
    t = 0.0
    for _ in range(reps):
        for c in range(s.f0.shape[0]):
            ch = view_wide(s, c)
            for k in range(8):
                t += work(ch, k)
    return t


@jit
def loop_narrow(s, reps):
    t = 0.0
    for _ in range(reps):
        for c in range(s.f0.shape[0]):
            ch = view_narrow(s, c)
            for k in range(8):
                t += work(ch, k)
    return t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--calls", type=int, default=20000, help="rounds of 16 chains × 8 calls")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    wide = Wide(*[rng.random((16, 512)) for _ in range(20)])
    narrow = Narrow(*[rng.random((16, 512)) for _ in range(10)])
    loop_wide(wide, 1), loop_narrow(narrow, 1)  # compiled outside the timings
    per = args.calls * 16 * 8
    for r in range(args.repeats):
        times = {}
        sides = [("wide", loop_wide, wide), ("narrow", loop_narrow, narrow)]
        for name, fn, s in sides if r % 2 == 0 else sides[::-1]:
            t = time.perf_counter()
            fn(s, args.calls)
            times[name] = (time.perf_counter() - t) / per * 1e9
        print(f"per call: 20 arrays {times['wide']:.0f} ns, 10 arrays {times['narrow']:.0f} ns, "
              f"ratio {times['wide'] / times['narrow']:.2f}, load {os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
