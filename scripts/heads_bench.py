"""The native library's heads alone, per sequence and step, at several batch sizes (README,
"Speed": why batch 64 stays short).

    python scripts/heads_bench.py [--batch-size 1,2,4,8,16,32,64] [--memory-size 128]

Builds ``heads_bench.cpp`` (beside this script; it includes ``csrc/kernels.cpp`` with the
library's own compiler flags) and times one step's heads of the paper's copy model (one read and
one write head, memory N x 20, three shifts: addressing, erase and add, the read) over 41 steps
of B sequences, the state of every step kept as training keeps it, then the same steps backward:
the least over ``--repeats`` of the nanoseconds per sequence and step, and the megabytes the
forward keeps for the backward. One thread, no controller, no Python: where the per-sequence
cost grows with the batch, it is the kept state leaving the cache.
"""

import argparse
import ctypes
from pathlib import Path

from torch.utils import cpp_extension

from torch_ntm import native


def build() -> ctypes.CDLL:
    path = cpp_extension.load(
        name="torch_ntm_heads_bench", sources=[str(Path(__file__).with_name("heads_bench.cpp"))],
        extra_cflags=native._flags(), extra_include_paths=[str(native._CSRC)],
        is_python_module=False, verbose=False)
    lib = ctypes.CDLL(path)
    lib.heads_bench.argtypes = [ctypes.c_int64] * 4 + [ctypes.POINTER(ctypes.c_double)]
    lib.heads_bench.restype = ctypes.c_int
    return lib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", default="1,2,4,8,16,32,64")
    parser.add_argument("--memory-size", default="128")
    parser.add_argument("--steps", type=int, default=41)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    lib = build()
    print(f"{'rows':>5} {'batch':>5} {'forward ns':>11} {'backward ns':>12} {'kept MB':>8}"
          "   (per sequence and step)")
    for rows in (int(n) for n in args.memory_size.split(",")):
        for batch in (int(b) for b in args.batch_size.split(",")):
            out = (ctypes.c_double * 2)()
            lib.heads_bench(batch, args.steps, rows, args.repeats, out)
            # kept per step and sequence: the memory (N x 20) and the heads' cosines (2N), float32
            kept = args.steps * batch * (rows * 20 + 2 * rows) * 4 / 1e6
            print(f"{rows:>5} {batch:>5} {out[0]:>11.0f} {out[1]:>12.0f} {kept:>8.2f}")


if __name__ == "__main__":
    main()
