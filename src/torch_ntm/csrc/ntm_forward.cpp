// The NTM's kernels forward (ntm.h), for this build's float type, behind one C function.

#include "ntm.h"

namespace torch_ntm {

template void forward<Real>(const View<Real>&, const Params<Real>&, int64_t, bool);

namespace {

// lists: each layer's weights, then the biases of layers 1 and up.
template <typename F>
void run_forward(const NTMCall* d, const uintptr_t* p) {
  using A = NTMCallForward;
  const Addresses<F, A> a(*d, p);
  const int64_t L = a.v.c.L;
  Params<F> params{a[A::xpre], {}, {}, a[A::wp], a[A::bp], a[A::reads0]};
  for (int64_t l = 0; l < L; ++l) {
    params.weights.push_back(a.list(l));
    if (l > 0) params.biases.push_back(a.list(L + l - 1));
  }
  forward<F>(a.v, params, d->steps, d->keep_all != 0);
}

}  // namespace
}  // namespace torch_ntm

TORCH_NTM_ENTRY(torch_ntm_forward, NTMCall, torch_ntm::run_forward)
