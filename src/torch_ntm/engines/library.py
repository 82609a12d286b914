"""The native library: every model's C++ kernels (``csrc/*.cpp``), built on first use and called
through ctypes.

The library is built with `torch.utils.cpp_extension` (a C++ compiler and ninja, which ``pip
install ninja`` provides; no torch header but ATen's vector type, so seconds on a 2-core CPU) and
cached on disk (``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``): one build
serves every model, size, sequence length and float dtype. torch allocates every buffer and the C
functions fill them; each returns 0, or 1 with its C++ exception's message, which `call` raises.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch

__all__ = ["DTYPES", "available", "call", "error", "keep_freed_memory", "library"]

_log = logging.getLogger("torch_ntm.engines")

_CSRC = Path(__file__).resolve().parent.parent / "csrc"
_LIBRARY: dict = {}  # "lib": the ctypes library, or "error": why there is none
DTYPES = {torch.float32: 0, torch.float64: 1}  # the dtypes the kernels compute in, by C code

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 1 << 30) -> bool:
    """Let glibc's malloc keep and reuse freed blocks instead of returning them to the system.

    A native training step allocates its buffers (every step's memories and addressing, for the
    backward) afresh and frees them at the end; above glibc's mmap threshold each such block is
    mapped and unmapped, so every step pays page faults and the zeroing of fresh pages. With both
    thresholds raised, freed blocks are reused (docs/speed.md has the measurement). The cost: up to
    ``trim_threshold`` bytes of freed memory stay with the process. ``ntm`` commands call this at
    start, and the native engines on their first call unless ``TORCH_NTM_KEEP_FREED_MEMORY=0`` is
    in the environment.

    Returns:
        True if both settings took (glibc), False where there is no glibc ``mallopt``.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold))


def _flags() -> list[str]:
    # omp simd pragmas only (no OpenMP runtime); errno is never read, and setting it would keep
    # the loops with a square root from vectorising.
    flags = ["-O3", "-fopenmp-simd", "-fno-math-errno"]
    # ATen's vector type takes the form of the CPU's best instruction set that torch's own kernels
    # use (torch.backends.cpu.get_cpu_capability(); ATEN_CPU_CAPABILITY=avx2 in the environment
    # lowers it), and SLEEF's exp, log and tanh of that width with it.
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512":
        flags += ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
                  "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"]
    elif capability == "AVX2":
        flags += ["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"]
    return flags


def _sources() -> list[Path]:
    return sorted(_CSRC.glob("*.cpp"))


def _declare(lib: ctypes.CDLL) -> None:
    """Argument and result types of the library's own functions (`call` declares the kernels')."""
    lib.torch_ntm_last_error.argtypes, lib.torch_ntm_last_error.restype = [], ctypes.c_char_p
    lib.torch_ntm_has_blas.argtypes, lib.torch_ntm_has_blas.restype = [], ctypes.c_int


# Every kernel is ``int name(int dtype, const int64_t* sizes, const double* reals,
# const uintptr_t* pointers)``.
_KERNEL_ARGS = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]


def library() -> ctypes.CDLL | None:
    """The ctypes library, building it first if needed (once per process); None if it cannot be
    built, with the reason in `error`."""
    if not _LIBRARY:
        try:
            from torch.utils import cpp_extension

            capability = torch.backends.cpu.get_cpu_capability().lower()
            path = cpp_extension.load(
                name=f"torch_ntm_native_{capability}", sources=[str(s) for s in _sources()],
                extra_cflags=_flags(), extra_include_paths=[str(_CSRC)],
                is_python_module=False, verbose=False)
            lib = ctypes.CDLL(path)
            _declare(lib)
            _LIBRARY["lib"] = lib
            if not lib.torch_ntm_has_blas():
                _log.warning("the native library found no BLAS exported by torch: its matmuls "
                             "run a plain loop, many times slower")
        except Exception as exc:  # no compiler, no ninja, a failed build
            _LIBRARY["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
    return _LIBRARY.get("lib")


def available() -> bool:
    """Whether the native library is built and loaded (building it first if needed)."""
    return library() is not None


def error() -> str | None:
    """Why the library could not be built, or None."""
    library()
    return _LIBRARY.get("error")


def call(name: str, dtype: torch.dtype, sizes: list[int], reals: list[float],
         pointers: list[int]) -> None:
    """Calls kernel ``name`` of the library.

    Raises:
        RuntimeError: with the C++ exception's message, if the kernel threw.
    """
    lib = library()
    sizes_c = (ctypes.c_int64 * len(sizes))(*sizes)
    reals_c = (ctypes.c_double * len(reals))(*reals)
    ptrs = (ctypes.c_void_p * len(pointers))(*pointers)
    kernel = getattr(lib, name)
    if kernel.restype is not ctypes.c_int:
        kernel.argtypes, kernel.restype = _KERNEL_ARGS, ctypes.c_int
    if kernel(DTYPES[dtype], sizes_c, reals_c, ptrs) != 0:
        message = lib.torch_ntm_last_error().decode(errors="replace")
        raise RuntimeError(f"torch_ntm native {name} failed: {message}")
