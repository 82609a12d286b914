// The NTM's kernels backward (ntm.h), for this build's float type, behind one C function.

#include "ntm.h"

namespace torch_ntm {

template void backward<Real>(const View<Real>&, const Params<Real>&, int64_t, const Real*,
                             const Real*, Carried<Real>&, const std::vector<Real*>&, Real*);

namespace {

// pointers: NTMCallBackward's, the buffers, then each layer's weights and each layer's dpre
// (engines/calls.py's NTMCall).
template <typename F>
void run_backward(const NTMCall* d, const uintptr_t* p) {
  using A = NTMCallBackward;
  const View<F> v(*d, p + A::count);
  const uintptr_t* lists = p + A::count + v.end;
  auto ptr = [&](size_t i) { return reinterpret_cast<F*>(p[i]); };
  Params<F> params{};
  params.wp = ptr(A::wp);
  std::vector<F*> dpre;
  for (int64_t l = 0; l < v.c.L; ++l) {
    params.weights.push_back(reinterpret_cast<const F*>(lists[l]));
    dpre.push_back(reinterpret_cast<F*>(lists[v.c.L + l]));
  }
  Carried<F> carried{ptr(A::dmem), ptr(A::dwr), ptr(A::dww), ptr(A::dreads0), ptr(A::dh),
                     ptr(A::dc)};
  backward<F>(v, params, d->steps, ptr(A::dhs), ptr(A::dreads), carried, dpre, ptr(A::draw));
}

}  // namespace
}  // namespace torch_ntm

TORCH_NTM_ENTRY(torch_ntm_backward, NTMCall, torch_ntm::run_backward)
