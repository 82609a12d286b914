// The NTM's kernels backward (ntm.h), for this build's float type, behind one C function.

#include "ntm.h"

namespace torch_ntm {

template void backward<Real>(const View<Real>&, const Params<Real>&, int64_t, const Real*,
                             const Real*, Carried<Real>&, const std::vector<Real*>&, Real*);

namespace {

template <typename F>
void run_backward(const NTMCall* d, const uintptr_t* p) {
  View<F> v{config(*d)};
  const int64_t L = v.c.L;
  Params<F> params{};
  params.wp = reinterpret_cast<const F*>(p[0]);
  size_t i = 1;
  i += take(p + i, L, params.weights);
  i += take_view(p + i, d->steps + 1, d->steps, v);
  std::vector<F*> g;
  i += take(p + i, 8, g);  // dh_out, dreads_out, then the carried dmem, dwr, dww, dreads, dh, dc
  Carried<F> carried{g[2], g[3], g[4], g[5], g[6], g[7]};
  std::vector<F*> dpre;
  i += take(p + i, L, dpre);
  backward<F>(v, params, d->steps, g[0], g[1], carried, dpre, reinterpret_cast<F*>(p[i]));
}

}  // namespace
}  // namespace torch_ntm

TORCH_NTM_ENTRY(torch_ntm_backward, NTMCall, torch_ntm::run_backward)
