// What the library's C entry points share (common.h includes it for the kernels; library.cpp needs
// nothing else, so it compiles in a fraction of a second): the float type of this build, the BLAS
// torch exports, and the error reporting of a call.

#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

// torch's BLAS (its MKL), where it exports one: weak, so that the library loads without it.
extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*,
            const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*,
            const double*, const int*, const double*, const int*, const double*, double*,
            const int*) __attribute__((weak));
}

namespace torch_ntm {

// One library per float type (engines/library.py builds the float64 one with TORCH_NTM_FLOAT64
// when a float64 model first runs): each build compiles half the kernels, so the first build, of
// the default float32, takes half the time.
#ifdef TORCH_NTM_FLOAT64
using Real = double;
constexpr int kDtype = 1;  // the dtype code of engines/library.py's DTYPES
#else
using Real = float;
constexpr int kDtype = 0;
#endif

// Whether `gemm` runs torch's BLAS (false: the plain loop, much slower).
inline bool has_blas() { return sgemm_ != nullptr && dgemm_ != nullptr; }

// ------------------------------------------------------------------------------------------------
// The C entry points: run(...) with no exception crossing into C, its message kept for Python.
// ------------------------------------------------------------------------------------------------

// The message of the last failed call (read by Python through `torch_ntm_last_error`).
inline char* last_error() {
  static thread_local char message[512] = "";
  return message;
}

// 0 after run(), or 1 with the exception's message in `last_error`; `dtype`, the caller's dtype
// code, must be this build's.
template <typename Run>
int guarded(int dtype, const Run& run) {
  try {
    if (dtype != kDtype) {
      throw std::invalid_argument("a call in dtype code " + std::to_string(dtype) +
                                  " to the library built for code " + std::to_string(kDtype));
    }
    run();
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(last_error(), 512, "%s", e.what());
  } catch (...) {
    std::snprintf(last_error(), 512, "unknown C++ exception");
  }
  return 1;
}

}  // namespace torch_ntm

// The C entry point `name(int dtype, const Call* d, const uintptr_t* p)` of a kernel: runs
// `run<Real>(d, p)` (`Call`, the kernel's description in calls.h; `p`, the addresses of its
// tensors), guarded. Every model's kernels declare theirs with it; the dtype codes are this
// build's (0 float32, 1 float64), and a failed call returns 1 with its message in
// torch_ntm_last_error.
#define TORCH_NTM_ENTRY(name, Call, run)                                               \
  extern "C" int name(int dtype, const torch_ntm::Call* d, const uintptr_t* p) {       \
    return torch_ntm::guarded(dtype, [&] { run<torch_ntm::Real>(d, p); });             \
  }
