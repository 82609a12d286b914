// The DNC's native engine (engines/dnc.py is its Python side): all T steps of
// `torch_ntm.dnc._DNCBase._step` forward, and backward in reverse, one C call each, on buffers
// torch allocated. The controller's and the interface layer's matmuls are `gemm` calls over the
// batch (common.h's `controller_forward`); the memory access of a step (dnc_functional's
// equations: retention, usage, allocation, write weighting, erase and write, link, precedence,
// directional weightings, read content, read modes, reads) is loops over one batch element's
// memory, in the paper's [N, W] layout. The backward recomputes each step's intermediates from the
// state kept for every step (memory, usage, link, precedence and weightings) and its interface
// layer output, then runs the step's equations backward.
//
// Shapes: T steps, B batch, C controller units, R read heads, one write head, memory N rows of
// width W, P interface outputs (torch_ntm.layout.DNC_FIELDS, where each field starts given by
// the call: `DNCCall`).

#include "calls.h"  // generated from engines/dnc.py's DNCCall
#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <utility>
#include <vector>

namespace torch_ntm {
namespace {
namespace dnc {

struct Cfg : CallSizes {
  int64_t R, W, P;
  // where each interface field starts in a row of the interface layer's output
  int64_t rkey, rstr, wkey, wstr, erase, wvec, free, agate, wgate, modes;

  int64_t RW() const { return R * W; }
};

// The activations `activate` and its backward implement, field by field: the table calls.h has
// from layout.DNC_FIELDS must say the same, or this file must change with it.
static_assert(kDncActivation[DNC_READ_KEY] == DNC_NONE &&
                  kDncActivation[DNC_READ_STRENGTH] == DNC_ONEPLUS &&
                  kDncActivation[DNC_WRITE_KEY] == DNC_NONE &&
                  kDncActivation[DNC_WRITE_STRENGTH] == DNC_ONEPLUS &&
                  kDncActivation[DNC_ERASE] == DNC_SIGMOID &&
                  kDncActivation[DNC_WRITE_VECTOR] == DNC_NONE &&
                  kDncActivation[DNC_FREE_GATE] == DNC_SIGMOID &&
                  kDncActivation[DNC_ALLOCATION_GATE] == DNC_SIGMOID &&
                  kDncActivation[DNC_WRITE_GATE] == DNC_SIGMOID &&
                  kDncActivation[DNC_READ_MODE] == DNC_SOFTMAX,
              "dnc.cpp activates the interface as layout.DNC_FIELDS did when it was written");

// The call's sizes, checked: each interface field wherever the call puts it, as wide as the
// table in calls.h makes it (one write head: its read modes are 3 a read head), together the P
// outputs without overlap.
Cfg config(const DNCCall& d) {
  const Cfg c{call_sizes(d, "dnc"), d.read_heads,     d.width,           d.fields,
              d.read_key,           d.read_strength,  d.write_key,       d.write_strength,
              d.erase,              d.write_vector,   d.free_gate,       d.allocation_gate,
              d.write_gate,         d.read_mode};
  if (c.R < 1 || c.W < 1) {
    throw std::invalid_argument("dnc: invalid sizes");
  }
  const auto start = dnc_starts(d);  // by field, in the table's order
  std::vector<std::pair<int64_t, int64_t>> spans;  // (start, width) of each field
  for (size_t f = 0; f < std::size(kDncSize); ++f) {
    const int64_t width = kDncSize[f] == DNC_WIDTH ? c.W : kDncSize[f] == DNC_ONE ? 1 : 3;
    spans.emplace_back(start[f], (kDncReadHeads[f] ? c.R : 1) * width);
  }
  if (!tiles(spans, c.P)) {
    throw std::invalid_argument("dnc: the interface fields must cover its outputs, no overlap");
  }
  return c;
}

// One batch element's state (a slot): memory [N, W], usage [N], link [N, N], precedence [N],
// read weightings [R, N], write weighting [N].
template <typename F>
struct State {
  F *mem, *usage, *link, *prec, *wr, *ww;
};

// The buffers (DNCCall.buffers, engines/calls.py; the accessors generated into calls.h), with
// the call's sizes: a slot's state and a step's weightings for one batch element.
template <typename F>
struct View : DNCCallBuffers<F> {
  View(const DNCCall& d, const uintptr_t* p) : c(config(d)) { this->take(d, p); }
  using Base = DNCCallBuffers<F>;
  using Base::fwd;
  using Base::bwd;
  Cfg c;

  State<F> state(int64_t s, int64_t b) const {
    const int64_t N = c.N;
    return {this->mem(s) + b * N * c.W, this->usage(s) + b * N, this->link(s) + b * N * N,
            this->prec(s) + b * N,      this->wr(s) + b * c.R * N, this->ww(s) + b * N};
  }
  F* fwd(int64_t st, int64_t b) const { return fwd(st) + b * c.R * c.N; }
  F* bwd(int64_t st, int64_t b) const { return bwd(st) + b * c.R * c.N; }
};

// What a step computes on the way, for one batch element: what its backward needs.
template <typename F>
struct Scratch {
  std::vector<F> act;     // [P] the activated interface
  std::vector<F> psi;     // [N] retention
  std::vector<F> wcos, cw, winv;  // [N] write content: cosines, weighting, 1 / |M_{t-1} row|
  std::vector<int64_t> order;     // [N] the free list: rows by ascending usage
  std::vector<F> before;  // [N] prod of the sorted usages before each place
  std::vector<F> alloc;   // [N] allocation weighting
  std::vector<F> rcos, rc;  // [R, N] read content: cosines, weightings
  std::vector<F> rinv;      // [N] 1 / |M_t row|

  explicit Scratch(const Cfg& c)
      : act(c.P), psi(c.N), wcos(c.N), cw(c.N), winv(c.N), order(c.N), before(c.N),
        alloc(c.N), rcos(c.R * c.N), rc(c.R * c.N),
        rinv(c.N) {}
};

// a . b for the DNC's short rows (N and W are tens): vector accumulators summed by a tree at the
// end, where common.h's `dot` sums its lanes one by one, which costs more than its products at
// these lengths (the profile's hottest line, in the link pass).
template <typename F>
inline F short_dot(const F* a, const F* b, int64_t n) {
  using V = Vec<F>;
  constexpr int64_t W = V::size();
  V s0(F(0)), s1(F(0));
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    s0 = fmadd(V::loadu(a + i), V::loadu(b + i), s0);
    s1 = fmadd(V::loadu(a + i + W), V::loadu(b + i + W), s1);
  }
  for (; i < n; i += W) {
    const int64_t m = std::min<int64_t>(W, n - i);
    s0 = fmadd(load_n(a + i, m), load_n(b + i, m), s0);
  }
  return (s0 + s1).reduce_add();
}

// ------------------------------------------------------------------------------------------------
// Forward of one batch element's memory access.
// ------------------------------------------------------------------------------------------------

// The activated interface (layout.DNCLayout.activate): keys and the write vector as they are,
// strengths 1 + softplus, erase and the gates sigmoid, each read mode a softmax of 3.
template <typename F>
void activate(const Cfg& c, const F* raw, F* act) {
  std::copy(raw, raw + c.P, act);
  for (int64_t r = 0; r < c.R; ++r) act[c.rstr + r] = F(1) + softplus(raw[c.rstr + r]);
  act[c.wstr] = F(1) + softplus(raw[c.wstr]);
  map1(act + c.erase, raw + c.erase, c.W, vsigmoid<F>);
  for (int64_t r = 0; r < c.R; ++r) act[c.free + r] = sigmoid(raw[c.free + r]);
  act[c.agate] = sigmoid(raw[c.agate]);
  act[c.wgate] = sigmoid(raw[c.wgate]);
  for (int64_t r = 0; r < c.R; ++r) {  // torch.softmax: shifted by the max
    const F* x = raw + c.modes + 3 * r;
    F* y = act + c.modes + 3 * r;
    const F mx = std::max(x[0], std::max(x[1], x[2]));
    F e[3], total = 0;
    for (int k = 0; k < 3; ++k) total += (e[k] = std::exp(x[k] - mx));
    for (int k = 0; k < 3; ++k) y[k] = e[k] / total;
  }
}

// 1 / sqrt(|row|^2 + EPS) for each of the N rows of mem [N, W].
template <typename F>
void inverse_norms(const F* mem, int64_t N, int64_t W, F* inv) {
  for (int64_t i = 0; i < N; ++i) inv[i] = F(1) / std::sqrt(short_dot(mem + i * W, mem + i * W, W) + F(kEps));
}

// functional.content_weights for one key: cos [N] the cosine similarities, w [N] the softmax of
// beta cos, from the rows' inverse norms inv [N].
template <typename F>
void content(const F* mem, const F* inv, const F* key, F beta, int64_t N, int64_t W, F* cos,
             F* w) {
  const F ik = F(1) / std::sqrt(short_dot(key, key, W) + F(kEps));
  for (int64_t i = 0; i < N; ++i) {
    cos[i] = short_dot(key, mem + i * W, W) * ik * inv[i];
    w[i] = beta * cos[i];
  }
  softmax_inplace(w, N);
}

// The step's addressing up to the write weighting's parts: the activated interface, retention,
// usage (into `usage`), the write content weighting on M_{t-1} and the allocation weighting.
template <typename F>
void address_write(const Cfg& c, const F* raw, const State<F>& prev, F* usage, Scratch<F>& s) {
  const int64_t N = c.N, W = c.W, R = c.R;
  F* a = s.act.data();
  activate(c, raw, a);
  // Retention and usage (dnc_functional.retention, usage): 1 - (1 - w) is the one head's
  // "written", as the eager loop rounds it.
  std::fill(s.psi.begin(), s.psi.end(), F(1));
  for (int64_t r = 0; r < R; ++r) {
    const F f = a[c.free + r];
    const F* w = prev.wr + r * N;
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) s.psi[i] *= F(1) - f * w[i];
  }
  for (int64_t i = 0; i < N; ++i) {
    const F written = F(1) - (F(1) - prev.ww[i]);
    usage[i] = (prev.usage[i] + written - prev.usage[i] * written) * s.psi[i];
  }
  inverse_norms(prev.mem, N, W, s.winv.data());
  content(prev.mem, s.winv.data(), a + c.wkey, a[c.wstr], N, W, s.wcos.data(), s.cw.data());
  // The free list: a stable sort of the usage, ascending; then eq. (1).
  std::iota(s.order.begin(), s.order.end(), int64_t(0));
  std::stable_sort(s.order.begin(), s.order.end(),
                   [usage](int64_t i, int64_t j) { return before(usage[i], i, usage[j], j); });
  F prod = 1;
  for (int64_t j = 0; j < N; ++j) {
    const int64_t i = s.order[j];
    s.before[j] = prod;
    s.alloc[i] = (F(1) - usage[i]) * prod;
    prod *= usage[i];
  }
}

// The read content weightings on M_t (`mem`).
template <typename F>
void address_read(const Cfg& c, const F* mem, Scratch<F>& s) {
  const int64_t N = c.N, W = c.W;
  inverse_norms(mem, N, W, s.rinv.data());
  for (int64_t r = 0; r < c.R; ++r) {
    content(mem, s.rinv.data(), s.act.data() + c.rkey + r * W, s.act[c.rstr + r], N, W,
            s.rcos.data() + r * N, s.rc.data() + r * N);
  }
}

// One step from `prev` into `next`, reads [R, W] of the new memory; s: the intermediates, fwd and
// bwd [R, N] the directional weightings (kept for the backward).
template <typename F>
void access(const Cfg& c, const F* raw, const State<F>& prev, const State<F>& next, F* reads,
            F* fwd, F* bwd, Scratch<F>& s) {
  const int64_t N = c.N, W = c.W, R = c.R;
  address_write(c, raw, prev, next.usage, s);
  const F* a = s.act.data();
  // Write weighting, erase and write.
  const F ga = a[c.agate], gw = a[c.wgate];
  F total = 0;
  for (int64_t i = 0; i < N; ++i) {
    next.ww[i] = gw * (ga * s.alloc[i] + (F(1) - ga) * s.cw[i]);
    total += next.ww[i];
  }
  const F* e = a + c.erase;
  const F* v = a + c.wvec;
  for (int64_t i = 0; i < N; ++i) {
    const F wi = next.ww[i];
    const F* mp = prev.mem + i * W;
    F* m = next.mem + i * W;
#pragma omp simd
    for (int64_t j = 0; j < W; ++j) m[j] = mp[j] * (F(1) - wi * e[j]) + wi * v[j];
  }
  // The link matrix a row at a time, and with each row (in L1) its part of the directional
  // weightings of every read head: fwd[r, i] = L[i, :] . w_r, bwd[r, :] += w_r[i] L[i, :].
  std::fill(bwd, bwd + R * N, F(0));
  const F* ww = next.ww;
  const F* pp = prev.prec;
  for (int64_t i = 0; i < N; ++i) {
    const F wi = ww[i];
    const F* lp = prev.link + i * N;
    F* l = next.link + i * N;
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) l[j] = (F(1) - wi - ww[j]) * lp[j] + wi * pp[j];
    l[i] = 0;
    for (int64_t r = 0; r < R; ++r) {
      const F* w = prev.wr + r * N;
      fwd[r * N + i] = short_dot(l, w, N);
      const F wri = w[i];
      F* b = bwd + r * N;
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) b[j] += wri * l[j];
    }
  }
  for (int64_t i = 0; i < N; ++i) next.prec[i] = (F(1) - total) * pp[i] + ww[i];
  // Read content on M_t, read modes, reads.
  address_read(c, next.mem, s);
  for (int64_t r = 0; r < R; ++r) {
    const F* m = a + c.modes + 3 * r;
    const F *rc = s.rc.data() + r * N, *f = fwd + r * N, *bk = bwd + r * N;
    F* wr = next.wr + r * N;
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) wr[i] = m[1] * rc[i] + m[0] * bk[i] + m[2] * f[i];
    combine_rows(next.mem, wr, N, W, reads + r * W, false);
  }
}

// ------------------------------------------------------------------------------------------------
// Backward of one batch element's memory access.
// ------------------------------------------------------------------------------------------------

// functional.content_weights backward for one key, from dw [N]: adds to dmem [N, W] and dkey [W],
// returns d beta. Scratch: ddot, t [N].
template <typename F>
F content_backward(const F* mem, const F* inv, const F* key, F beta, int64_t N, int64_t W,
                   const F* cos, const F* w, const F* dw, F* dmem, F* dkey, F* ddot, F* t) {
  const F inner = short_dot(w, dw, N);
  const F kq = short_dot(key, key, W) + F(kEps);
  const auto [dbeta, tk] =
      content_softmax_backward(w, dw, inner, cos, beta, F(1) / std::sqrt(kq), inv, N, ddot, t);
  for (int64_t i = 0; i < N; ++i) {
    // d|row|^2 = -t / (2 (|row|^2 + EPS)); the row's gradient gains 2 row d|row|^2
    const F dsq2 = -t[i] * inv[i] * inv[i];
    const F di = ddot[i];
    const F* m = mem + i * W;
    F* dm = dmem + i * W;
#pragma omp simd
    for (int64_t j = 0; j < W; ++j) dm[j] += di * key[j] + dsq2 * m[j];
  }
  combine_rows(mem, ddot, N, W, dkey, true);
  const F dkq2 = -tk / kq;  // 2 d|key|^2
#pragma omp simd
  for (int64_t j = 0; j < W; ++j) dkey[j] += dkq2 * key[j];
  return dbeta;
}

// Carried gradients of one batch element's state: in, those of the state after the step (`next`);
// out, of the state before it (`prev`). dreads [R, W]: the step's reads' (all of it).
template <typename F>
struct Grads {
  F *dmem, *dusage, *dlink, *dprec, *dwr, *dww;
};

// Scratch of the backward, for one batch element.
template <typename F>
struct BackScratch {
  std::vector<F> dact, dwr, dmem, dlink, dww, dalloc, dcw, du, dpsi, ddot, dt, drc, dfwd, dbwd,
      dwrp, dpp;
  explicit BackScratch(const Cfg& c)
      : dact(c.P), dwr(c.R * c.N), dmem(c.N * c.W), dlink(c.N), dww(c.N), dalloc(c.N),
        dcw(c.N), du(c.N), dpsi(c.N), ddot(c.N), dt(c.N), drc(c.N), dfwd(c.R * c.N),
        dbwd(c.R * c.N), dwrp(c.R * c.N), dpp(c.N) {}
};

template <typename F>
void access_backward(const Cfg& c, const F* raw, const State<F>& prev, const State<F>& next,
                     const Scratch<F>& s, const F* fwd, const F* bwd, const F* dreads,
                     Grads<F>& g, BackScratch<F>& k, F* draw) {
  const int64_t N = c.N, W = c.W, R = c.R;
  const F* a = s.act.data();
  F* dact = k.dact.data();
  std::fill(k.dact.begin(), k.dact.end(), F(0));
  // Reads: the read weightings' and the memory's gradients.
  std::copy(g.dmem, g.dmem + N * W, k.dmem.begin());
  F* dmem = k.dmem.data();
  for (int64_t r = 0; r < R; ++r) {
    const F* dr = dreads + r * W;
    const F* wr = next.wr + r * N;
    F* dw = k.dwr.data() + r * N;
    for (int64_t i = 0; i < N; ++i) {
      dw[i] = g.dwr[r * N + i] + short_dot(next.mem + i * W, dr, W);
      const F wi = wr[i];
      F* dm = dmem + i * W;
#pragma omp simd
      for (int64_t j = 0; j < W; ++j) dm[j] += wi * dr[j];
    }
  }
  // Read modes and read content; dfwd, dbwd [R, N]: the directional weightings' gradients.
  F* dfwd = k.dfwd.data();
  F* dbwd = k.dbwd.data();
  for (int64_t r = 0; r < R; ++r) {
    const F* dw = k.dwr.data() + r * N;
    const F* m = a + c.modes + 3 * r;
    const F *f = fwd + r * N, *bk = bwd + r * N, *rc = s.rc.data() + r * N;
    const F dm[3] = {short_dot(dw, bk, N), short_dot(dw, rc, N), short_dot(dw, f, N)};
    const F inner = m[0] * dm[0] + m[1] * dm[1] + m[2] * dm[2];
    for (int q = 0; q < 3; ++q) draw[c.modes + 3 * r + q] = m[q] * (dm[q] - inner);
    F* drc = k.drc.data();
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) {
      drc[i] = m[1] * dw[i];
      dfwd[r * N + i] = m[2] * dw[i];
      dbwd[r * N + i] = m[0] * dw[i];
    }
    dact[c.rstr + r] = content_backward(next.mem, s.rinv.data(), a + c.rkey + r * W,
                                        a[c.rstr + r], N, W, s.rcos.data() + r * N, rc, drc,
                                        dmem, dact + c.rkey + r * W, k.ddot.data(), k.dt.data());
  }
  // Precedence: p = (1 - sum ww) p_{t-1} + ww.
  const F* ww = next.ww;
  const F* pp = prev.prec;
  F total = 0;
  for (int64_t i = 0; i < N; ++i) total += ww[i];
  const F dp_pp = short_dot(g.dprec, pp, N);
  F* dww = k.dww.data();
  F* dpp = k.dpp.data();
  for (int64_t i = 0; i < N; ++i) {
    dww[i] = g.dww[i] + g.dprec[i] - dp_pp;
    dpp[i] = (F(1) - total) * g.dprec[i];
  }
  // The link matrix a row at a time (each in L1). fwd[r, i] = L[i, :] . w_r and
  // bwd[r, :] = sum_i w_r[i] L[i, :] (w_r = wr_{t-1}[r]) give the link's gradient
  // dL[i, :] = carried + sum_r dfwd[r, i] w_r + w_r[i] dbwd[r, :] (0 on the diagonal) and the
  // previous read weightings' dwrp[r, :] += dfwd[r, i] L[i, :], dwrp[r, i] += L[i, :] . dbwd[r];
  // then L[i, j] = (1 - ww[i] - ww[j]) Lp[i, j] + ww[i] pp[j] backward.
  F* dwrp = k.dwrp.data();
  std::fill(k.dwrp.begin(), k.dwrp.end(), F(0));
  F* dl = k.dlink.data();  // one row
  for (int64_t i = 0; i < N; ++i) {
    const F* l = next.link + i * N;
    F* dlp = g.dlink + i * N;  // the carried link gradient, replaced by L_{t-1}'s
    std::copy(dlp, dlp + N, dl);
    for (int64_t r = 0; r < R; ++r) {
      const F* w = prev.wr + r * N;
      const F dfi = dfwd[r * N + i], wri = w[i];
      const F* db = dbwd + r * N;
      F* dwp = dwrp + r * N;
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) {
        dl[j] += dfi * w[j] + wri * db[j];
        dwp[j] += dfi * l[j];
      }
      dwp[i] += short_dot(l, db, N);
    }
    dl[i] = 0;  // the diagonal is held at 0
    const F* lp = prev.link + i * N;
    const F wi = ww[i];
    F row = 0;
#pragma omp simd reduction(+ : row)
    for (int64_t j = 0; j < N; ++j) {
      row += dl[j] * (pp[j] - lp[j]);
      dww[j] -= dl[j] * lp[j];
      dpp[j] += dl[j] * wi;
      dlp[j] = dl[j] * (F(1) - wi - ww[j]);
    }
    dww[i] += row;
  }
  // Erase and write: M = Mp (1 - ww e^T) + ww v^T.
  const F* e = a + c.erase;
  const F* v = a + c.wvec;
  F* de = dact + c.erase;
  F* dv = dact + c.wvec;
  for (int64_t i = 0; i < N; ++i) {
    const F wi = ww[i];
    const F* mp = prev.mem + i * W;
    const F* dm = dmem + i * W;
    F* dmp = g.dmem + i * W;  // the carried memory gradient, replaced by M_{t-1}'s
    F acc = 0;
    for (int64_t j = 0; j < W; ++j) {
      acc += dm[j] * (v[j] - mp[j] * e[j]);
      de[j] -= dm[j] * mp[j] * wi;
      dv[j] += dm[j] * wi;
      dmp[j] = dm[j] * (F(1) - wi * e[j]);
    }
    dww[i] += acc;
  }
  // Write weighting: ww = gw (ga alloc + (1 - ga) cw).
  const F ga = a[c.agate], gw = a[c.wgate];
  F dgw = 0, dga = 0;
  for (int64_t i = 0; i < N; ++i) {
    dgw += dww[i] * (ga * s.alloc[i] + (F(1) - ga) * s.cw[i]);
    dga += dww[i] * (s.alloc[i] - s.cw[i]);
    k.dalloc[i] = gw * ga * dww[i];
    k.dcw[i] = gw * (F(1) - ga) * dww[i];
  }
  draw[c.wgate] = dgw * gw * (F(1) - gw);
  draw[c.agate] = dga * gw * ga * (F(1) - ga);
  // Write content on M_{t-1}.
  dact[c.wstr] = content_backward(prev.mem, s.winv.data(), a + c.wkey, a[c.wstr], N, W,
                                  s.wcos.data(), s.cw.data(), k.dcw.data(), g.dmem,
                                  dact + c.wkey, k.ddot.data(), k.dt.data());
  // Allocation: a[phi_j] = (1 - u[phi_j]) prod_{i<j} u[phi_i], the order a constant.
  F* du = k.du.data();
  std::copy(g.dusage, g.dusage + N, du);
  const F* u = next.usage;
  F q = 0;  // sum over later places k of da_k (1 - s_k) prod_{j<i<k} s_i
  for (int64_t j = N - 1; j >= 0; --j) {
    const int64_t i = s.order[j];
    const F da = k.dalloc[i];
    du[i] += s.before[j] * (q - da);
    q = da * (F(1) - u[i]) + u[i] * q;
  }
  // Usage: u = (up + w - up w) psi, w = 1 - (1 - ww_{t-1}); retention psi = prod_r (1 - f_r wr).
  F* dpsi = k.dpsi.data();
  for (int64_t i = 0; i < N; ++i) {
    const F up = prev.usage[i];
    const F written = F(1) - (F(1) - prev.ww[i]);
    dpsi[i] = du[i] * (up + written - up * written);
    g.dusage[i] = du[i] * s.psi[i] * (F(1) - written);
    g.dww[i] = du[i] * s.psi[i] * (F(1) - up);
  }
  for (int64_t r = 0; r < R; ++r) {
    const F f = a[c.free + r];
    const F* w = prev.wr + r * N;
    F* dwp = dwrp + r * N;
    F df = 0;
    for (int64_t i = 0; i < N; ++i) {
      F others = 1;  // prod over the other heads (R is small: no division, no prefix tables)
      for (int64_t o = 0; o < R; ++o) {
        if (o != r) others *= F(1) - a[c.free + o] * prev.wr[o * N + i];
      }
      const F d = dpsi[i] * others;
      df -= d * w[i];
      dwp[i] -= d * f;
    }
    dact[c.free + r] = df;
  }
  std::copy(dwrp, dwrp + R * N, g.dwr);
  std::copy(dpp, dpp + N, g.dprec);
  // The activations backward.
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < W; ++j) draw[c.rkey + r * W + j] = dact[c.rkey + r * W + j];
    draw[c.rstr + r] = dact[c.rstr + r] * sigmoid(raw[c.rstr + r]);
    const F f = a[c.free + r];
    draw[c.free + r] = dact[c.free + r] * f * (F(1) - f);
  }
  for (int64_t j = 0; j < W; ++j) {
    draw[c.wkey + j] = dact[c.wkey + j];
    draw[c.wvec + j] = dact[c.wvec + j];
    draw[c.erase + j] = dact[c.erase + j] * e[j] * (F(1) - e[j]);
  }
  draw[c.wstr] = dact[c.wstr] * sigmoid(raw[c.wstr]);
}

// ------------------------------------------------------------------------------------------------
// All steps.
// ------------------------------------------------------------------------------------------------

template <typename F>
void forward(const View<F>& v, const Controller<F>& p) {
  const Cfg& c = v.c;
  const int64_t B = c.B, C = c.C, RW = c.RW();
  Scratch<F> s(c);
  const ControllerWeights<F> w(c, RW, c.P, p.wih, p.whh, p.wp, true);
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t s0 = c.keep_all ? t : t % 2, s1 = c.keep_all ? t + 1 : (t + 1) % 2;
    const int64_t st = c.keep_all ? t : 0;
    F* raw = v.raw(st);
    controller_forward(B, C, RW, c.P, t == 0 ? p.reads0 : v.reads(t - 1),
                       t == 0 ? p.h0 : v.hs(t - 1), p.xpre + t * B * c.G(), w, p.bp,
                       v.cell(s0), v.cell(s1), v.z(st), v.act(st), v.hs(t), raw);
    for (int64_t b = 0; b < B; ++b) {
      access(c, raw + b * c.P, v.state(s0, b), v.state(s1, b), v.reads(t) + b * RW,
             v.fwd(st, b), v.bwd(st, b), s);
    }
  }
}

template <typename F>
void backward(const View<F>& v, const F* wih, const F* whh, const F* wp, const F* dhs,
              const F* dreads_out, Grads<F> g, F* dreads, F* dh, F* dc, F* dgates, F* draw) {
  const Cfg& c = v.c;
  const int64_t B = c.B, C = c.C, RW = c.RW(), N = c.N, W = c.W, R = c.R;
  const ControllerWeights<F> w(c, RW, c.P, wih, whh, wp, false);
  Scratch<F> s(c);
  BackScratch<F> k(c);
  // The step's intermediates, recomputed from the state kept (the usage again into scratch).
  std::vector<F> usage(N), dr(RW);
  std::vector<F> dhb(B * C), tc(C);
  for (int64_t t = c.T - 1; t >= 0; --t) {
    const F* raw = v.raw(t);
    F* drw = draw + t * B * c.P;
    for (int64_t b = 0; b < B; ++b) {
      const State<F> prev = v.state(t, b), next = v.state(t + 1, b);
      address_write(c, raw + b * c.P, prev, usage.data(), s);
      address_read(c, next.mem, s);
      const F* dro = dreads_out + (t * B + b) * RW;
      for (int64_t e = 0; e < RW; ++e) dr[e] = dro[e] + dreads[b * RW + e];
      Grads<F> gb{g.dmem + b * N * W, g.dusage + b * N, g.dlink + b * N * N, g.dprec + b * N,
                  g.dwr + b * R * N, g.dww + b * N};
      access_backward(c, raw + b * c.P, prev, next, s, v.fwd(t, b), v.bwd(t, b), dr.data(), gb,
                      k, drw + b * c.P);
    }
    controller_backward(B, C, RW, c.P, drw, dhs + t * B * C, w, v.act(t), v.cell(t),
                        v.cell(t + 1), dh, dc, dreads, dgates + t * B * c.G(), dhb.data(),
                        tc.data());
  }
}

// ------------------------------------------------------------------------------------------------
// The C entry points (entry.h's TORCH_NTM_ENTRY): their pointers, read by the generated enums.
// ------------------------------------------------------------------------------------------------


// pointers: DNCCallForward's, then the buffers.
template <typename F>
void run_forward(const DNCCall* d, const uintptr_t* p) {
  using A = DNCCallForward;
  forward<F>(View<F>(*d, p + A::count), controller_args<F, A>(p));
}

// pointers: DNCCallBackward's, then the buffers.
template <typename F>
void run_backward(const DNCCall* d, const uintptr_t* p) {
  using A = DNCCallBackward;
  const View<F> v(*d, p + A::count);
  if (!v.c.keep_all) throw std::invalid_argument("dnc: the backward needs every step's state");
  auto ptr = [&](size_t i) { return reinterpret_cast<F*>(p[i]); };
  Grads<F> g{ptr(A::dmem), ptr(A::dusage), ptr(A::dlink), ptr(A::dprec), ptr(A::dwr),
             ptr(A::dww)};
  backward<F>(v, arg<F>(p, A::wih), arg<F>(p, A::whh), arg<F>(p, A::wp), ptr(A::dhs),
              ptr(A::dreads), g, ptr(A::dreads0), ptr(A::dh), ptr(A::dc), ptr(A::dgates),
              ptr(A::draw));
}

}  // namespace dnc
}  // namespace
}  // namespace torch_ntm

TORCH_NTM_ENTRY(torch_ntm_dnc_forward, DNCCall, torch_ntm::dnc::run_forward)
TORCH_NTM_ENTRY(torch_ntm_dnc_backward, DNCCall, torch_ntm::dnc::run_backward)
