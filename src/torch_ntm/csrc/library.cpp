// The native library's own C entry points (the kernels' are in ntm_*.cpp and mann.cpp): what
// Python asks of the library as a whole.

#include "entry.h"

extern "C" {

// The message of the last call that returned 1 on this thread.
const char* torch_ntm_last_error() { return torch_ntm::last_error(); }

// 1 if the matmuls run torch's BLAS, 0 if the plain loop (much slower: Python logs it once).
int torch_ntm_has_blas() { return torch_ntm::has_blas() ? 1 : 0; }

}  // extern "C"
