// The NTM's kernels backward (ntm.h), for this build's float type, behind one C function.

#include "ntm.h"

namespace torch_ntm {

template void backward<Real>(const View<Real>&, const Params<Real>&, int64_t, const Real*,
                             const Real*, Carried<Real>&, const std::vector<Real*>&, Real*);

namespace {

// lists: each layer's weights, then each layer's dpre (written).
template <typename F>
void run_backward(const NTMCall* d, const uintptr_t* p) {
  using A = NTMCallBackward;
  const Addresses<F, A> a(*d, p);
  Params<F> params{};
  params.wp = a[A::wp];
  std::vector<F*> dpre;
  for (int64_t l = 0; l < a.v.c.L; ++l) {
    params.weights.push_back(a.list(l));
    dpre.push_back(a.list(a.v.c.L + l));
  }
  Carried<F> g{a[A::dmem], a[A::dwr], a[A::dww], a[A::dreads0], a[A::dh], a[A::dc]};
  backward<F>(a.v, params, d->steps, a[A::dhs], a[A::dreads], g, dpre, a[A::draw]);
}

}  // namespace
}  // namespace torch_ntm

TORCH_NTM_ENTRY(torch_ntm_backward, NTMCall, torch_ntm::run_backward)
