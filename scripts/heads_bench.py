"""The native library's heads alone, per sequence and step, at several batch sizes
(docs/speed.md: why batch 64 stays short).

    python scripts/heads_bench.py [--batch-size 1,2,4,8,16,32,64] [--memory-size 128]

Builds ``heads_bench.cpp`` (beside this script; it includes ``csrc/ntm.h`` with the
library's own compiler flags) and times the heads of `NTM(9, 9, memory_size=N)`, the paper's copy
model (one read and one write head, memory N x 20, three shifts; the sizes and head layout the
library's call would get, from `torch_ntm.engines.ntm`): one step's addressing, erase and add and
read over 41 steps of B sequences, with random head parameters, the state of every step kept as
training keeps it, then the same steps backward. Prints the least over ``--repeats`` of the
nanoseconds per sequence and step, and the megabytes the forward keeps for the backward (each
step's memory and the heads' cosine similarities). One thread, no controller, no Python: where
the per-sequence cost grows with the batch, it is the kept state leaving the cache.
"""

import argparse
import ctypes
from pathlib import Path

import torch
from torch.utils import cpp_extension

from torch_ntm import NTM
from torch_ntm.engines import library
from torch_ntm.engines import ntm as native


def build() -> ctypes.CDLL:
    path = cpp_extension.load(
        name="torch_ntm_heads_bench", sources=[str(Path(__file__).with_name("heads_bench.cpp"))],
        extra_cflags=library._flags(),
        extra_include_paths=[str(library._CSRC), str(library._generated(library.header()))],
        is_python_module=False, verbose=False)
    lib = ctypes.CDLL(path)
    lib.heads_bench.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_double)]
    lib.heads_bench.restype = ctypes.c_int
    return lib


def time_heads(lib: ctypes.CDLL, rows: int, batch: int, steps: int, repeats: int):
    """(forward ns, backward ns, kept MB): the sizes from the library's own description."""
    model = NTM(9, 9, memory_size=rows)
    cfg = native._plan(model, torch.device("cpu")).cfg
    description = native._call(cfg, torch.finfo(torch.float32).tiny, steps, batch, rows, True)
    out = (ctypes.c_double * 2)()
    lib.heads_bench(ctypes.byref(description), repeats, out)
    heads = cfg.read_heads + cfg.write_heads
    kept = steps * batch * (rows * cfg.width + heads * rows) * 4 / 1e6
    return out[0], out[1], kept


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
            fwd, bwd, kept = time_heads(lib, rows, batch, args.steps, args.repeats)
            print(f"{rows:>5} {batch:>5} {fwd:>11.0f} {bwd:>12.0f} {kept:>8.2f}")


if __name__ == "__main__":
    main()
