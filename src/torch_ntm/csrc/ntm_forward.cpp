// The NTM's kernels forward (ntm.h), for this build's float type, behind one C function.

#include "ntm.h"

namespace torch_ntm {

template void forward<Real>(const View<Real>&, const Params<Real>&, int64_t, bool);

namespace {

template <typename F>
void run_forward(const NTMCall* d, const uintptr_t* p) {
  View<F> v{config(*d)};
  const int64_t L = v.c.L;
  Params<F> params;
  params.xpre = reinterpret_cast<const F*>(p[0]);
  params.wp = reinterpret_cast<const F*>(p[1]);
  params.bp = reinterpret_cast<const F*>(p[2]);
  params.reads0 = reinterpret_cast<const F*>(p[3]);
  size_t i = 4;
  i += take(p + i, L, params.weights);
  i += take(p + i, L - 1, params.biases);
  const bool keep_all = d->keep_all != 0;
  take_view(p + i, keep_all ? d->steps + 1 : 2, keep_all ? d->steps : 1, v);
  forward<F>(v, params, d->steps, keep_all);
}

}  // namespace
}  // namespace torch_ntm

TORCH_NTM_ENTRY(torch_ntm_forward, NTMCall, torch_ntm::run_forward)
