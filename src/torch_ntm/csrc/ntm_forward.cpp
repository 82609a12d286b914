// The NTM's kernels forward (ntm.h), for this build's float type, behind one C function.

#include "ntm.h"

namespace torch_ntm {

template void forward<Real>(const View<Real>&, const Params<Real>&, int64_t, bool);

namespace {

// pointers: NTMCallForward's, the buffers, then each layer's weights and the biases of layers
// 1 and up (engines/calls.py's NTMCall).
template <typename F>
void run_forward(const NTMCall* d, const uintptr_t* p) {
  using A = NTMCallForward;
  const View<F> v(*d, p + A::count);
  const uintptr_t* lists = p + A::count + v.end;
  Params<F> params;
  params.xpre = reinterpret_cast<const F*>(p[A::xpre]);
  params.wp = reinterpret_cast<const F*>(p[A::wp]);
  params.bp = reinterpret_cast<const F*>(p[A::bp]);
  params.reads0 = reinterpret_cast<const F*>(p[A::reads0]);
  for (int64_t l = 0; l < v.c.L; ++l) {
    params.weights.push_back(reinterpret_cast<const F*>(lists[l]));
    if (l > 0) params.biases.push_back(reinterpret_cast<const F*>(lists[v.c.L + l - 1]));
  }
  forward<F>(v, params, d->steps, d->keep_all != 0);
}

}  // namespace
}  // namespace torch_ntm

TORCH_NTM_ENTRY(torch_ntm_forward, NTMCall, torch_ntm::run_forward)
