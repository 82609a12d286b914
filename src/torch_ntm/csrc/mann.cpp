// The MANN's native engine (engines/mann.py is its Python side): all T steps of
// `torch_ntm.mann._MANNBase._step` forward, and backward in reverse, one C call each, on buffers
// torch allocated. The controller's and the head layer's matmuls are `gemm` calls over the batch;
// the rest of a step (head activations, the LRUA write weights, the write, cosine similarities,
// softmax, reads, usage and the least-used rows) is vectorised loops over one batch element's
// memory, kept transposed ([M, N] per batch element, so that loops over the N rows are
// contiguous).
//
// Shapes: T steps, B batch, C controller units, H heads, memory N rows of width M, P = H Fw head
// layer outputs, head k's at k Fw: its fields (torch_ntm.layout.LRUA_FIELDS) key (M, tanh),
// alpha (1, sigmoid), add (M, tanh; absent when the key is written) and beta (1, softplus; absent
// when beta = 1), each where the call says it starts.

#include "calls.h"  // generated from engines/mann.py's MANNCall
#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

namespace torch_ntm {
namespace {
namespace lrua {

struct Cfg : CallSizes {
  int64_t H, M, P, Fw, o_key, o_alpha, o_add, o_beta;
  double gamma;  // usage decay

  int64_t key(int64_t k) const { return k * Fw + o_key; }
  int64_t alpha(int64_t k) const { return k * Fw + o_alpha; }
  int64_t add(int64_t k) const { return k * Fw + (o_add < 0 ? o_key : o_add); }  // or the key's
  int64_t beta(int64_t k) const { return k * Fw + o_beta; }
};

// The activations `activate` and its backward implement (tanh over every output, then alpha's
// and beta's replaced): the table calls.h has from layout.LRUA_FIELDS must say the same, or this
// file must change with it.
static_assert(kMannActivation[MANN_KEY] == MANN_TANH &&
                  kMannActivation[MANN_ALPHA] == MANN_SIGMOID &&
                  kMannActivation[MANN_ADD] == MANN_TANH &&
                  kMannActivation[MANN_BETA] == MANN_SOFTPLUS,
              "mann.cpp activates the heads as layout.LRUA_FIELDS did when it was written");

// The call's sizes, checked: each head's fields wherever the call puts them (add and beta may be
// absent, -1), as wide as the table in calls.h makes them, together its Fw outputs without
// overlap.
Cfg config(const MANNCall& d) {
  const Cfg c{call_sizes(d, "mann"), d.heads, d.width, d.heads * d.fields, d.fields, d.key,
              d.alpha, d.add, d.beta, d.decay};
  if (c.H < 1 || c.M < 1 || c.N < c.H) {
    throw std::invalid_argument("mann: invalid sizes");
  }
  const auto start = mann_starts(d);  // by field, in the table's order
  std::vector<std::pair<int64_t, int64_t>> spans;  // (start, width) of each field present
  for (size_t f = 0; f < std::size(kMannSize); ++f) {
    if (start[f] >= 0) spans.emplace_back(start[f], kMannSize[f] == MANN_WIDTH ? c.M : 1);
  }
  if (c.o_key < 0 || c.o_alpha < 0 || !tiles(spans, c.Fw)) {
    throw std::invalid_argument(
        "mann: a head's fields (a key and alpha among them) must cover its outputs, no overlap");
  }
  return c;
}

// The buffers (MANNCall.buffers, engines/calls.py; the accessors generated into calls.h), with
// the call's sizes.
template <typename F>
struct View : MANNCallBuffers<F> {
  View(const MANNCall& d, const uintptr_t* p) : c(config(d)) { this->take(d, p); }
  Cfg c;
};

// ------------------------------------------------------------------------------------------------
// Small pieces: the heads' activations, the rows LRUA picks.
// ------------------------------------------------------------------------------------------------

// act (P, raw's layout): key and add tanh, alpha's slot sigmoid(alpha), beta's softplus(beta):
// tanh over all P outputs in one run, then the 1 or 2 scalars per head replaced.
template <typename F>
void activate(const Cfg& c, const F* raw, F* act) {
  map1(act, raw, c.P, [](Vec<F> x) { return x.tanh(); });
  for (int64_t k = 0; k < c.H; ++k) {
    act[c.alpha(k)] = sigmoid(raw[c.alpha(k)]);
    if (c.o_beta >= 0) act[c.beta(k)] = softplus(raw[c.beta(k)]);
  }
}

template <typename F>
inline F beta_of(const Cfg& c, const F* act, int64_t k) {
  return c.o_beta >= 0 ? act[c.beta(k)] : F(1);
}

// functional.least_used: lu [N] 1 at the first H rows of the stable sort of usage, else 0. One
// scan keeps the H first rows so far in order (best[0..H)); a later row enters only if it comes
// strictly before the last of them (on a tie the earlier row stays ahead), which a vector compare
// against that row's usage rules out for most rows at once.
template <typename F>
void least_used(const F* usage, int64_t N, int64_t H, F* lu) {
  using V = Vec<F>;
  constexpr int64_t W = V::size();
  int64_t few[8];
  std::vector<int64_t> many(H > 8 ? H : 0);
  int64_t* best = H > 8 ? many.data() : few;
  int64_t count = 0;
  auto offer = [&](int64_t i) {  // row i, after every row in best
    if (count == H && !before(usage[i], i, usage[best[H - 1]], best[H - 1])) return;
    int64_t pos = count < H ? count++ : H - 1;
    while (pos > 0 && before(usage[i], i, usage[best[pos - 1]], best[pos - 1])) {
      best[pos] = best[pos - 1];
      --pos;
    }
    best[pos] = i;
  };
  int64_t i = 0;
  for (; i < std::min(H, N); ++i) offer(i);
  for (; i + W <= N; i += W) {
    const F worst = usage[best[H - 1]];
    if (!std::isnan(worst)) {  // else every number comes first: row by row
      if (!any_below(V::loadu(usage + i), V(worst))) continue;  // NaN lanes: not below
    }
    for (int64_t l = i; l < i + W; ++l) offer(l);
  }
  for (; i < N; ++i) offer(i);
  std::fill(lu, lu + N, F(0));
  for (int64_t h = 0; h < H; ++h) lu[best[h]] = F(1);
}

// torch.argmin: the first minimum (the first NaN if any).
template <typename F>
int64_t argmin(const F* u, int64_t N) {
  F low = u[0];
  bool nan = std::isnan(low);
  for (int64_t i = 1; i < N; ++i) {
    low = u[i] < low ? u[i] : low;
    nan |= std::isnan(u[i]);
  }
  for (int64_t i = 0; i < N; ++i) {
    if (nan ? std::isnan(u[i]) : u[i] == low) return i;
  }
  return 0;
}

// The write weights ww [H, N] = lu + g (wr_prev - lu), g = sigmoid(alpha), and keep [N]: 1 but
// 0 at the row zeroed, argmin usage_prev.
template <typename F>
void write_weights(const Cfg& c, const F* act, const F* wr_prev, const F* lu, const F* usage_prev,
                   F* ww, F* keep) {
  const int64_t N = c.N;
  for (int64_t k = 0; k < c.H; ++k) {
    const F g = act[c.alpha(k)];
    const F* wp = wr_prev + k * N;
    F* w = ww + k * N;
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) w[i] = lu[i] + g * (wp[i] - lu[i]);
  }
  std::fill(keep, keep + N, F(1));
  keep[argmin(usage_prev, N)] = F(0);
}

// ------------------------------------------------------------------------------------------------
// Forward of one batch element's memory step.
// ------------------------------------------------------------------------------------------------

// One pass over the rows: mem[j] = mem_prev[j] keep + sum_k add_k[j] ww_k (functional.lrua_write),
// msq = the new rows' squared norms, and dots[k] = sum_j key_k[j] mem[j] (the cosine numerators),
// for KH = H <= 4 heads; a vector of rows at a time, its sums kept in registers over the M
// columns. coef [M, 2 KH]: add_k[j] and key_k[j] by row, so that one row's are adjacent.
template <typename F, int KH>
void write_pass(const Cfg& c, const F* coef, const F* ww, const F* keep, const F* mem_prev,
                F* mem, F* msq, F* dots) {
  using V = Vec<F>;
  const int64_t M = c.M, N = c.N;
  auto block = [&](int64_t i, auto load, auto store) {
    const V kp = load(keep + i);
    V w[KH], d[KH];
    for (int k = 0; k < KH; ++k) {
      w[k] = load(ww + k * N + i);
      d[k] = V(F(0));
    }
    V sq(F(0));
    for (int64_t j = 0; j < M; ++j) {
      const F* cj = coef + j * 2 * KH;
      V row = load(mem_prev + j * N + i) * kp;
      for (int k = 0; k < KH; ++k) row = fmadd(V(cj[k]), w[k], row);
      store(row, mem + j * N + i);
      sq = fmadd(row, row, sq);
      for (int k = 0; k < KH; ++k) d[k] = fmadd(V(cj[KH + k]), row, d[k]);
    }
    store(sq, msq + i);
    for (int k = 0; k < KH; ++k) store(d[k], dots + k * N + i);
  };
  int64_t i = 0;
  for (; i + V::size() <= N; i += V::size()) {
    block(i, [](const F* p) { return V::loadu(p); }, [](const V& v, F* p) { v.store(p); });
  }
  if (i < N) {
    const int64_t n = N - i;
    block(i, [n](const F* p) { return V::loadu(p, n); }, [n](const V& v, F* p) { v.store(p, n); });
  }
}

// The same for any number of heads: the write and norms, then the numerators a head at a time.
template <typename F>
void write_pass_any(const Cfg& c, const F* act, const F* ww, const F* keep, const F* mem_prev,
                    F* mem, F* msq, F* dots) {
  const int64_t M = c.M, N = c.N;
  std::fill(msq, msq + N, F(0));
  for (int64_t j = 0; j < M; ++j) {
    const F* prow = mem_prev + j * N;
    F* row = mem + j * N;
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) row[i] = prow[i] * keep[i];
    for (int64_t k = 0; k < c.H; ++k) {
      const F a = act[c.add(k) + j];
      const F* w = ww + k * N;
#pragma omp simd
      for (int64_t i = 0; i < N; ++i) row[i] += a * w[i];
    }
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) msq[i] += row[i] * row[i];
  }
  for (int64_t k = 0; k < c.H; ++k) combine_rows(mem, act + c.key(k), M, N, dots + k * N, false);
}

// coef: scratch of 8 M.
template <typename F>
void write_and_dots(const Cfg& c, const F* act, const F* ww, const F* keep, const F* mem_prev,
                    F* mem, F* msq, F* dots, F* coef) {
  const int64_t H = c.H;
  if (H <= 4) {
    for (int64_t j = 0; j < c.M; ++j) {
      for (int64_t k = 0; k < H; ++k) {
        coef[j * 2 * H + k] = act[c.add(k) + j];
        coef[j * 2 * H + H + k] = act[c.key(k) + j];
      }
    }
  }
  switch (H) {
    case 1: return write_pass<F, 1>(c, coef, ww, keep, mem_prev, mem, msq, dots);
    case 2: return write_pass<F, 2>(c, coef, ww, keep, mem_prev, mem, msq, dots);
    case 3: return write_pass<F, 3>(c, coef, ww, keep, mem_prev, mem, msq, dots);
    case 4: return write_pass<F, 4>(c, coef, ww, keep, mem_prev, mem, msq, dots);
    default: return write_pass_any(c, act, ww, keep, mem_prev, mem, msq, dots);
  }
}

// reads[k][j] = wr[k] . mem[j] for KH heads, all M rows: one pass over the rows, each row's
// products with the KH weightings in registers.
template <typename F, int KH>
void read_rows(const Cfg& c, const F* wr, const F* mem, F* reads) {
  using V = Vec<F>;
  const int64_t M = c.M, N = c.N;
  for (int64_t j = 0; j < M; ++j) {
    const F* row = mem + j * N;
    V acc[KH];
    for (int k = 0; k < KH; ++k) acc[k] = V(F(0));
    for (int64_t i = 0; i < N; i += V::size()) {
      const int64_t n = std::min<int64_t>(V::size(), N - i);
      const V x = load_n(row + i, n);
      for (int k = 0; k < KH; ++k) acc[k] = fmadd(load_n(wr + k * N + i, n), x, acc[k]);
    }
    for (int k = 0; k < KH; ++k) reads[k * M + j] = acc[k].reduce_add();
  }
}

template <typename F>
void read_all(const Cfg& c, const F* wr, const F* mem, F* reads) {
  switch (c.H) {
    case 1: return read_rows<F, 1>(c, wr, mem, reads);
    case 2: return read_rows<F, 2>(c, wr, mem, reads);
    case 3: return read_rows<F, 3>(c, wr, mem, reads);
    case 4: return read_rows<F, 4>(c, wr, mem, reads);
    default:
      for (int64_t k = 0; k < c.H; ++k) {
        for (int64_t j = 0; j < c.M; ++j) reads[k * c.M + j] = dot(wr + k * c.N, mem + j * c.N, c.N);
      }
  }
}

// inv[i] = 1 / sqrt(msq[i] + EPS), each row's factor of its cosine similarities.
template <typename F>
void inverse_norms(const F* msq, int64_t N, F* inv) {
#pragma omp simd
  for (int64_t i = 0; i < N; ++i) inv[i] = F(1) / std::sqrt(msq[i] + F(kEps));
}

// One batch element's step after the head layer: write (into mem, msq), address (cos, wr), read,
// usage and least used. act [P], ww [H, N], keep, inv [N], coef [8 M]: scratch.
template <typename F>
void memory_step(const Cfg& c, const F* raw, const F* mem_prev, const F* usage_prev,
                 const F* wr_prev, const F* lu_prev, F* mem, F* msq, F* usage, F* wr, F* lu,
                 F* reads, F* cos, F* act, F* ww, F* keep, F* inv, F* coef) {
  const int64_t M = c.M, N = c.N, H = c.H;
  activate(c, raw, act);
  write_weights(c, act, wr_prev, lu_prev, usage_prev, ww, keep);
  write_and_dots(c, act, ww, keep, mem_prev, mem, msq, cos, coef);
  inverse_norms(msq, N, inv);
  for (int64_t k = 0; k < H; ++k) {  // functional.content_weights
    const F* key = act + c.key(k);
    const F ik = F(1) / std::sqrt(dot(key, key, M) + F(kEps));
    const F beta = beta_of(c, act, k);
    F* ck = cos + k * N;
    F* w = wr + k * N;
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) {
      ck[i] *= ik * inv[i];
      w[i] = beta * ck[i];
    }
    softmax_inplace(w, N);
  }
  read_all(c, wr, mem, reads);
  const F gamma = F(c.gamma);
#pragma omp simd
  for (int64_t i = 0; i < N; ++i) usage[i] = gamma * usage_prev[i];
  for (int64_t k = 0; k < H; ++k) {
    const F* w = wr + k * N;
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) usage[i] += w[i];
  }
  for (int64_t k = 0; k < H; ++k) {
    const F* w = ww + k * N;
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) usage[i] += w[i];
  }
  least_used(usage, N, H, lu);
}

// ------------------------------------------------------------------------------------------------
// Backward of one batch element's memory step.
// ------------------------------------------------------------------------------------------------

// The pass over the rows j of mem (the memory this step wrote) that its backward makes: the
// gradient of mem[j], drow = dmem[j] (carried) + 2 mem[j] dmsq + sum_k (dreads_k[j] wr_k +
// key_k[j] ddot_k); then d key_k[j] += ddot_k . mem[j] + 2 key_k[j] dkq_k, d add_k[j] += ww_k .
// drow, dww_k += add_k[j] drow, and dmem[j] = drow keep (the gradient of mem_prev[j]), in place.
// KH = H heads, their vectors in registers over one row.
template <typename F, int KH>
void rows_backward(const Cfg& c, const F* mem, const F* act, const F* wr, const F* ddot,
                   const F* ww, const F* dkq, const F* dmsq, const F* keep, const F* dreads,
                   F* dmem, F* dww, F* dact) {
  using V = Vec<F>;
  const int64_t M = c.M, N = c.N;
  for (int64_t j = 0; j < M; ++j) {
    const F* row = mem + j * N;
    F* drow = dmem + j * N;
    V r[KH], kj[KH], a[KH], acc_key[KH], acc_add[KH];
    for (int k = 0; k < KH; ++k) {
      r[k] = V(dreads[k * M + j]);
      kj[k] = V(act[c.key(k) + j]);
      a[k] = V(act[c.add(k) + j]);
      acc_key[k] = acc_add[k] = V(F(0));
    }
    for (int64_t i = 0; i < N; i += V::size()) {
      const int64_t n = std::min<int64_t>(V::size(), N - i);
      const V x = load_n(row + i, n);
      V d = fmadd(V(F(2)) * x, load_n(dmsq + i, n), load_n(drow + i, n));
      for (int k = 0; k < KH; ++k) {
        const V dd = load_n(ddot + k * N + i, n);
        acc_key[k] = fmadd(dd, x, acc_key[k]);
        d = fmadd(r[k], load_n(wr + k * N + i, n), d);
        d = fmadd(kj[k], dd, d);
      }
      for (int k = 0; k < KH; ++k) {
        acc_add[k] = fmadd(load_n(ww + k * N + i, n), d, acc_add[k]);
        store_n(fmadd(a[k], d, load_n(dww + k * N + i, n)), dww + k * N + i, n);
      }
      store_n(d * load_n(keep + i, n), drow + i, n);
    }
    for (int k = 0; k < KH; ++k) {
      dact[c.key(k) + j] += acc_key[k].reduce_add() + F(2) * act[c.key(k) + j] * dkq[k];
      dact[c.add(k) + j] += acc_add[k].reduce_add();
    }
  }
}

// The same for any number of heads, a head at a time.
template <typename F>
void rows_backward_any(const Cfg& c, const F* mem, const F* act, const F* wr, const F* ddot,
                       const F* ww, const F* dkq, const F* dmsq, const F* keep, const F* dreads,
                       F* dmem, F* dww, F* dact) {
  const int64_t M = c.M, N = c.N, H = c.H;
  for (int64_t j = 0; j < M; ++j) {
    const F* row = mem + j * N;
    F* drow = dmem + j * N;
    for (int64_t k = 0; k < H; ++k) {
      dact[c.key(k) + j] += dot(ddot + k * N, row, N) + F(2) * act[c.key(k) + j] * dkq[k];
    }
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) drow[i] += F(2) * row[i] * dmsq[i];
    for (int64_t k = 0; k < H; ++k) {
      const F r = dreads[k * M + j], kj = act[c.key(k) + j];
      const F* w = wr + k * N;
      const F* dd = ddot + k * N;
#pragma omp simd
      for (int64_t i = 0; i < N; ++i) drow[i] += r * w[i] + kj * dd[i];
    }
    for (int64_t k = 0; k < H; ++k) {
      const F a = act[c.add(k) + j];
      dact[c.add(k) + j] += dot(ww + k * N, drow, N);
      F* d = dww + k * N;
#pragma omp simd
      for (int64_t i = 0; i < N; ++i) d[i] += a * drow[i];
    }
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) drow[i] *= keep[i];
  }
}

// From the gradients of this step's reads (dreads [H, M]) and of its state (dmem [M, N],
// dusage [N], dwr [H, N]), those of the previous state, in place (dmem, dusage, dwr), of the
// least-used rows it was given (dlu [N]) and of the head layer's output (draw [P]).
// Scratch: act, dact [P], ww, dw, ddot [H, N], keep, inv, dmsq, t [N].
template <typename F>
void memory_step_backward(const Cfg& c, const F* raw, const F* mem, const F* msq, const F* cos,
                          const F* usage_prev, const F* wr_prev, const F* lu_prev, const F* wr,
                          const F* dreads, F* dmem, F* dusage, F* dwr, F* dlu, F* draw, F* act,
                          F* dact, F* ww, F* dw, F* ddot, F* keep, F* inv, F* dmsq, F* t) {
  const int64_t M = c.M, N = c.N, H = c.H;
  activate(c, raw, act);
  write_weights(c, act, wr_prev, lu_prev, usage_prev, ww, keep);
  std::fill(dact, dact + c.P, F(0));
  // The read weightings' gradient: carried, from the usage, and from the reads.
  for (int64_t k = 0; k < H; ++k) {
    F* d = dw + k * N;
    const F* dk = dwr + k * N;
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) d[i] = dk[i] + dusage[i];
    combine_rows(mem, dreads + k * M, M, N, d, true);
  }
  // Softmax and cosine backward: ddot [H, N] of the numerators, dmsq, and d|key|^2 per head.
  inverse_norms(msq, N, inv);
  std::fill(dmsq, dmsq + N, F(0));
  F dkq_few[8];
  std::vector<F> dkq_many(H > 8 ? H : 0);
  F* dkq = H > 8 ? dkq_many.data() : dkq_few;
  for (int64_t k = 0; k < H; ++k) {
    const F* key = act + c.key(k);
    const F kq = dot(key, key, M) + F(kEps);
    const F ik = F(1) / std::sqrt(kq);
    const F beta = beta_of(c, act, k);
    const F* w = wr + k * N;
    const F* d = dw + k * N;
    F* dd = ddot + k * N;
    const auto [db, tk] =
        content_softmax_backward(w, d, dot(w, d, N), cos + k * N, beta, ik, inv, N, dd, t);
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) dmsq[i] += F(-0.5) * t[i] * inv[i] * inv[i];
    if (c.o_beta >= 0) dact[c.beta(k)] = db;
    dkq[k] = F(-0.5) * tk / kq;
  }
  // One pass over the rows (rows_backward); dw now collects the write weights' gradient.
  F* dww = dw;
  std::fill(dww, dww + H * N, F(0));
  switch (H) {
    case 1: rows_backward<F, 1>(c, mem, act, wr, ddot, ww, dkq, dmsq, keep, dreads, dmem, dww, dact); break;
    case 2: rows_backward<F, 2>(c, mem, act, wr, ddot, ww, dkq, dmsq, keep, dreads, dmem, dww, dact); break;
    case 3: rows_backward<F, 3>(c, mem, act, wr, ddot, ww, dkq, dmsq, keep, dreads, dmem, dww, dact); break;
    case 4: rows_backward<F, 4>(c, mem, act, wr, ddot, ww, dkq, dmsq, keep, dreads, dmem, dww, dact); break;
    default: rows_backward_any(c, mem, act, wr, ddot, ww, dkq, dmsq, keep, dreads, dmem, dww, dact);
  }
  // The write weights: from the write and the usage; then alpha, wr_prev and lu_prev.
  std::fill(dlu, dlu + N, F(0));
  for (int64_t k = 0; k < H; ++k) {
    const F g = act[c.alpha(k)];
    const F* wp = wr_prev + k * N;
    F* d = dww + k * N;
    F* dprev = dwr + k * N;
    F dg = 0;
#pragma omp simd reduction(+ : dg)
    for (int64_t i = 0; i < N; ++i) {
      const F dk = d[i] + dusage[i];
      dg += dk * (wp[i] - lu_prev[i]);
      dprev[i] = g * dk;
      dlu[i] += (F(1) - g) * dk;
    }
    dact[c.alpha(k)] = dg;
  }
  const F gamma = F(c.gamma);
#pragma omp simd
  for (int64_t i = 0; i < N; ++i) dusage[i] *= gamma;
  // The activations backward (where the key is written, dact's key slots hold both gradients).
  for (int64_t k = 0; k < H; ++k) {
    for (int64_t j = 0; j < M; ++j) {
      const int64_t pk = c.key(k) + j;
      draw[pk] = dact[pk] * (F(1) - act[pk] * act[pk]);
      if (c.o_add >= 0) {
        const int64_t pa = c.add(k) + j;
        draw[pa] = dact[pa] * (F(1) - act[pa] * act[pa]);
      }
    }
    const F g = act[c.alpha(k)];
    draw[c.alpha(k)] = dact[c.alpha(k)] * g * (F(1) - g);
    if (c.o_beta >= 0) draw[c.beta(k)] = dact[c.beta(k)] * softplus_grad(raw[c.beta(k)]);
  }
}

// ------------------------------------------------------------------------------------------------
// All steps.
// ------------------------------------------------------------------------------------------------

template <typename F>
void forward(const View<F>& v, const Controller<F>& p, F* work) {
  const Cfg& c = v.c;
  const int64_t B = c.B, C = c.C, H = c.H, M = c.M, N = c.N;
  const ControllerWeights<F> w(c, H * M, c.P, p.wih, p.whh, p.wp, true);
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t s0 = c.keep_all ? t : t % 2, s1 = c.keep_all ? t + 1 : (t + 1) % 2;
    const int64_t st = c.keep_all ? t : 0;
    // Controller and head layer (common.h).
    F* raw = v.raw(st);
    controller_forward(B, C, H * M, c.P, t == 0 ? p.reads0 : v.reads(t - 1),
                       t == 0 ? p.h0 : v.hs(t - 1), p.xpre + t * B * c.G(), w, p.bp,
                       v.cell(s0), v.cell(s1), v.z(st), v.act(st), v.hs(t), raw);
    // Where every step's memory is kept, the step computes in two slots of work that stay in
    // cache, and its memory is streamed to the history (written in place, each step's new
    // lines were first read from DRAM: ~4 of a 16 ms forward at the paper's sizes).
    const F* up = v.usage(s0);
    const F *wrp = v.wr(s0), *lp = v.lu(s0);
    F *qn = v.msq(s1), *un = v.usage(s1), *wrn = v.wr(s1), *ln = v.lu(s1);
    const F* mp = c.keep_all ? work + (t % 2) * B * M * N : v.mem(s0);
    F* mn = c.keep_all ? work + ((t + 1) % 2) * B * M * N : v.mem(s1);
    F* history = c.keep_all ? v.mem(s1) : nullptr;
    F* rd = v.reads(t);
    F* cs = v.cos(st);
    {
      std::vector<F> act(c.P), ww(H * N), keep(N), inv(N), coef(8 * M);
      for (int64_t b = 0; b < B; ++b) {
        memory_step(c, raw + b * c.P, mp + b * M * N, up + b * N, wrp + b * H * N, lp + b * N,
                    mn + b * M * N, qn + b * N, un + b * N, wrn + b * H * N, ln + b * N,
                    rd + b * H * M, cs + b * H * N, act.data(), ww.data(), keep.data(),
                    inv.data(), coef.data());
        if (history) stream_copy(mn + b * M * N, history + b * M * N, M * N);
      }
    }
    if (history) stream_fence();
  }
}

// The gradients carried from step t + 1 to step t, updated in place.
template <typename F>
struct Carried {
  F* dmem;    // [B, M, N]
  F* dusage;  // [B, N]
  F* dwr;     // [B, H, N]
  F* dreads;  // [B, H, M]
  F* dh;      // [B, C]
  F* dc;      // [B, C]
  F* dlu;     // [B, N] (written: the initial least-used rows' gradient in the end)
};

// dhs [T, B, C] and dreads_out [T, B, H, M]: the gradients of each step's outputs; writes
// dgates [T, B, 4C] (the LSTM's pre-activations) and draw [T, B, P] (the head layer's outputs).
template <typename F>
void backward(const View<F>& v, const F* wih, const F* whh, const F* wp, const F* dhs,
              const F* dreads_out, Carried<F>& g, F* dgates, F* draw) {
  const Cfg& c = v.c;
  const int64_t B = c.B, C = c.C, H = c.H, M = c.M, N = c.N;
  const ControllerWeights<F> w(c, H * M, c.P, wih, whh, wp, false);
  std::vector<F> dh(B * C), tc(C), dr(B * H * M);
  for (int64_t t = c.T - 1; t >= 0; --t) {
    const F* dro = dreads_out + t * B * H * M;
#pragma omp simd
    for (int64_t e = 0; e < B * H * M; ++e) dr[e] = dro[e] + g.dreads[e];
    const F* raw = v.raw(t);
    const F *mn = v.mem(t + 1), *qn = v.msq(t + 1), *wrn = v.wr(t + 1);
    const F *up = v.usage(t), *wrp = v.wr(t), *lp = v.lu(t);
    const F* cs = v.cos(t);
    F* drw = draw + t * B * c.P;
    {
      std::vector<F> act(c.P), dact(c.P), ww(H * N), dw(H * N), ddot(H * N), keep(N), inv(N),
          dmsq(N), tn(N);
      for (int64_t b = 0; b < B; ++b) {
        memory_step_backward(c, raw + b * c.P, mn + b * M * N, qn + b * N, cs + b * H * N,
                             up + b * N, wrp + b * H * N, lp + b * N, wrn + b * H * N,
                             dr.data() + b * H * M, g.dmem + b * M * N, g.dusage + b * N,
                             g.dwr + b * H * N, g.dlu + b * N, drw + b * c.P, act.data(),
                             dact.data(), ww.data(), dw.data(), ddot.data(), keep.data(),
                             inv.data(), dmsq.data(), tn.data());
      }
    }
    // h_t feeds the outputs, the head layer and the next step's gates (common.h).
    controller_backward(B, C, H * M, c.P, drw, dhs + t * B * C, w, v.act(t), v.cell(t),
                        v.cell(t + 1), g.dh, g.dc, g.dreads, dgates + t * B * c.G(), dh.data(),
                        tc.data());
  }
}

// ------------------------------------------------------------------------------------------------
// The C entry points (entry.h's TORCH_NTM_ENTRY): their pointers, read by the generated enums.
// ------------------------------------------------------------------------------------------------


// pointers: MANNCallForward's, then the buffers.
template <typename F>
void run_forward(const MANNCall* d, const uintptr_t* p) {
  using A = MANNCallForward;
  forward<F>(View<F>(*d, p + A::count), controller_args<F, A>(p),
             reinterpret_cast<F*>(p[A::work]));
}

// pointers: MANNCallBackward's, then the buffers.
template <typename F>
void run_backward(const MANNCall* d, const uintptr_t* p) {
  using A = MANNCallBackward;
  const View<F> v(*d, p + A::count);
  if (!v.c.keep_all) throw std::invalid_argument("mann: the backward needs every step's state");
  auto ptr = [&](size_t i) { return reinterpret_cast<F*>(p[i]); };
  Carried<F> g{ptr(A::dmem), ptr(A::dusage), ptr(A::dwr), ptr(A::dreads0),
               ptr(A::dh),   ptr(A::dc),     ptr(A::dlu)};
  backward<F>(v, arg<F>(p, A::wih), arg<F>(p, A::whh), arg<F>(p, A::wp), ptr(A::dhs),
              ptr(A::dreads), g, ptr(A::dgates), ptr(A::draw));
}

}  // namespace lrua
}  // namespace
}  // namespace torch_ntm

TORCH_NTM_ENTRY(torch_ntm_mann_forward, MANNCall, torch_ntm::lrua::run_forward)
TORCH_NTM_ENTRY(torch_ntm_mann_backward, MANNCall, torch_ntm::lrua::run_backward)
