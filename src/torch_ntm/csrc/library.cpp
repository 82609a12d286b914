// The native library's own C entry points (the kernels' are in ntm_*.cpp and mann.cpp): what
// Python asks of the library as a whole.

#include "common.h"

extern "C" {

// The message of the last call that returned 1 on this thread.
const char* torch_ntm_last_error() { return torch_ntm::last_error(); }

// 1 if the matmuls run torch's BLAS, 0 if the plain loop (much slower: Python logs it once).
int torch_ntm_has_blas() { return torch_ntm::has_blas() ? 1 : 0; }

// out [m, n] += x [m, k] w [n, k]^T, each entry summed in one order whatever m
// (`torch_ntm::gemm_rows_invariant`): the input side of the MANN's and the DNC's LSTM, so that
// a sequence gets the same bits alone as in a batch, as their steps do.
int torch_ntm_linear_rows(int dtype, int64_t m, int64_t n, int64_t k, const void* x,
                          const void* w, void* out) {
  using torch_ntm::Real;
  return torch_ntm::guarded(dtype, [&] {
    torch_ntm::gemm_rows_invariant<Real>(m, n, k, static_cast<const Real*>(x),
                                         static_cast<const Real*>(w), static_cast<Real*>(out));
  });
}

}  // extern "C"
