// The NTM's native engine (see sequence.h and engines/ntm.py): one NTM step forward and backward
// for a batch, on raw pointers, looped over the sequence; ntm_forward.cpp and ntm_backward.cpp
// (two translation units, so that a build compiles them on two cores) put each behind a C function
// that engines/ntm.py calls with the addresses of buffers torch allocated. The same function as the
// model's eager step (`NTM._step`, with `functional.address`, `write` and `read`): the
// controller's and the head layer's matmuls are BLAS calls over the whole batch, and the rest of
// a step (head activations, addressing, erase and add, reads, the LSTM's gates) plain loops over
// one batch element's memory, vectorised.

#pragma once

#include "common.h"
#include "sequence.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace torch_ntm {
namespace {

// Row i + offset of n rows, circularly (|offset| < n), as two straight runs: rows i < split are
// at i + lo, rows from split on at i + hi.
struct Circular {
  int64_t split, lo, hi;
  Circular(int64_t offset, int64_t n)
      : split(offset >= 0 ? n - offset : -offset),
        lo(offset >= 0 ? offset : offset + n),
        hi(offset >= 0 ? offset - n : offset) {}
};

// out[i] += coef * in[i + offset], rows circular (|offset| < n).
template <typename F>
inline void shift_add(F* out, const F* in, F coef, int64_t offset, int64_t n) {
  const Circular w(offset, n);
#pragma omp simd
  for (int64_t i = 0; i < w.split; ++i) out[i] += coef * in[i + w.lo];
#pragma omp simd
  for (int64_t i = w.split; i < n; ++i) out[i] += coef * in[i + w.hi];
}

// sum_i a[i] in[i + offset], rows circular (|offset| < n).
template <typename F>
inline F shift_dot(const F* a, const F* in, int64_t offset, int64_t n) {
  const Circular w(offset, n);
  F acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < w.split; ++i) acc += a[i] * in[i + w.lo];
#pragma omp simd reduction(+ : acc)
  for (int64_t i = w.split; i < n; ++i) acc += a[i] * in[i + w.hi];
  return acc;
}

// ------------------------------------------------------------------------------------------------
// Head activations (`HeadLayout.activate`, on the permuted rows) and their backward.
// ------------------------------------------------------------------------------------------------

template <typename F>
inline F cap_value(F v, double cap) { return cap == 0 ? v : F(cap) * std::tanh(v / F(cap)); }

// act: the activated head parameters of one batch element, in raw's layout; gamma's slot holds
// gamma itself (1 + capped softplus).
template <typename F>
void activate(const Cfg& c, const F* raw, F* act) {
  map1(act, raw, c.o_sig, [](Vec<F> x) { return x.tanh(); });
  map1(act + c.o_sig, raw + c.o_sig, c.o_sp - c.o_sig, vsigmoid<F>);
  for (int64_t k = 0; k < c.H; ++k) {
    act[c.beta(k)] = cap_value(softplus(raw[c.beta(k)]), c.beta_cap);
    act[c.gamma(k)] = F(1) + cap_value(softplus(raw[c.gamma(k)]), c.gamma_cap);
  }
  for (int64_t k = 0; k < c.H; ++k) {
    const F* z = raw + c.shift(k);
    F* s = act + c.shift(k);
    F mx = *std::max_element(z, z + c.S);
    F total = 0;
    for (int64_t q = 0; q < c.S; ++q) total += (s[q] = std::exp(z[q] - mx));
    for (int64_t q = 0; q < c.S; ++q) s[q] /= total;
  }
}

// draw = d(act)/d(raw) applied to dact (dact of gamma's slot is d/d gamma).
template <typename F>
void activate_backward(const Cfg& c, const F* raw, const F* act, const F* dact, F* draw) {
  for (int64_t p = 0; p < c.o_sig; ++p) draw[p] = dact[p] * (F(1) - act[p] * act[p]);
  for (int64_t p = c.o_sig; p < c.o_sp; ++p) draw[p] = dact[p] * act[p] * (F(1) - act[p]);
  for (int64_t k = 0; k < c.H; ++k) {
    const int64_t pb = c.beta(k), pg = c.gamma(k);
    F db = dact[pb] * softplus_grad(raw[pb]);
    if (c.beta_cap) db *= F(1) - (act[pb] / F(c.beta_cap)) * (act[pb] / F(c.beta_cap));
    F dg = dact[pg] * softplus_grad(raw[pg]);
    if (c.gamma_cap) {
      const F v = (act[pg] - F(1)) / F(c.gamma_cap);
      dg *= F(1) - v * v;
    }
    draw[pb] = db;
    draw[pg] = dg;
  }
  for (int64_t k = 0; k < c.H; ++k) {
    const F* s = act + c.shift(k);
    const F* ds = dact + c.shift(k);
    const F inner = dot(ds, s, c.S);
    for (int64_t q = 0; q < c.S; ++q) draw[c.shift(k) + q] = s[q] * (ds[q] - inner);
  }
}

// ------------------------------------------------------------------------------------------------
// Addressing (`functional.address`, eq. 5-9) of one head of one batch element, and its backward. The
// forward keeps only the cosine similarities (cos [N]) for the backward, which recomputes the
// weightings in between (`weightings`, the same machine code: not inlined) from them: the kept
// state of every step is what the backward reads back from DRAM at large batches.
// ------------------------------------------------------------------------------------------------

// From the cosine similarities to the shifted weighting before sharpening: wc (eq. 5), wg (eq. 7)
// and ws (eq. 8), each [N]; returns the scale of the sharpening, max(ws, tiny).
template <typename F>
__attribute__((noinline)) F weightings(const Cfg& c, const F* cos, F beta, const F* w_prev,
                                       F gate, const F* s, F* wc, F* wg, F* ws) {
  const int64_t N = c.N, R = c.R;
#pragma omp simd
  for (int64_t i = 0; i < N; ++i) wc[i] = beta * cos[i];
  softmax_inplace(wc, N);  // eq. (5)
#pragma omp simd
  for (int64_t i = 0; i < N; ++i) wg[i] = w_prev[i] + gate * (wc[i] - w_prev[i]);  // eq. (7)
  std::fill(ws, ws + N, F(0));
  for (int64_t q = 0; q < c.S; ++q) shift_add(ws, wg, s[q], R - q, N);  // eq. (8)
  return max_of(ws, N, F(c.tiny));
}

// cos: the kept cosine similarities [N]; work: scratch of 3N.
template <typename F>
void address(const Cfg& c, const F* mem, const F* msq, const F* w_prev, const F* key, F beta,
             F gate, const F* s, F gamma, F* cos, F* work, F* w) {
  const int64_t M = c.M, N = c.N;
  const F ksq = dot(key, key, M) + F(kEps);
  combine_rows(mem, key, M, N, cos, false);
#pragma omp simd
  for (int64_t i = 0; i < N; ++i) cos[i] /= std::sqrt(ksq * (msq[i] + F(kEps)));
  F* ws = work + 2 * N;
  const F scale = weightings(c, cos, beta, w_prev, gate, s, work, work + N, ws);
  // eq. (9): u^gamma = exp(gamma log u), u = ws / scale in [0, 1]; 0 at u = 0.
  const Vec<F> vscale(scale), vgamma(gamma);
  map1(w, ws, N, [&](Vec<F> v) { return (vgamma * (v / vscale).log()).exp(); });
  const F inv = F(1) / sum(w, N);
#pragma omp simd
  for (int64_t i = 0; i < N; ++i) w[i] *= inv;
}

// Gradients of `address` given dw, but for the pass over the memory's rows, which the caller makes
// once for all heads on that memory (`rows_backward`): writes dw_prev and d beta, gate, s [S],
// gamma into dact's slots; adds to dmsq [N]; writes ddot [N], the gradient of the cosine
// numerators (d mem[j] += key[j] ddot, d key[j] = ddot . mem[j] + 2 key[j] dksq), and returns
// dksq, that of the key's squared norm. cos: the kept cosine similarities; tmp: scratch of 5N.
template <typename F>
F address_backward(const Cfg& c, const F* dw, const F* msq, const F* w_prev, const F* key, F beta,
                   F gate, const F* s, F gamma, const F* w, const F* cos, F* dw_prev,
                   F* dbeta, F* dgate, F* ds, F* dgamma, F* dmsq, F* ddot, F* tmp) {
  const int64_t M = c.M, N = c.N, R = c.R;
  const F tiny = F(c.tiny);
  F* dws = tmp;
  F* dwg = tmp + N;
  F* wc = tmp + 2 * N;
  F* wg = tmp + 3 * N;
  F* ws = tmp + 4 * N;
  const F scale = weightings(c, cos, beta, w_prev, gate, s, wc, wg, ws);
  // Sharpen: w = p / sum(p), p = u^gamma, u = ws / scale (scale a constant, as in eager).
  const F inner = dot(dw, w, N);
  F* u = dwg;  // scratch: u, clamped to tiny (where u = 0, p = 0 and so are these terms)
  const F inv_scale = F(1) / scale;
#pragma omp simd
  for (int64_t i = 0; i < N; ++i) u[i] = std::max(ws[i] * inv_scale, tiny);
  F* log_u = dws;
  map1(log_u, u, N, [](Vec<F> v) { return v.log(); });
  // d p / d u at u = 0 is gamma 0^(gamma - 1): 1, not 0, where gamma = 1 (as in eager's
  // `functional.sharpen`); there p = u, dL/du = dL/dp = (dw - inner) / sum(u), and so
  // dL/dws = (dw - inner) / sum(ws).
  const bool linear = gamma == F(1);
  const F inv_ws_sum = linear ? F(1) / sum(ws, N) : F(0);
  F dgam = 0;
#pragma omp simd reduction(+ : dgam)
  for (int64_t i = 0; i < N; ++i) {
    const F dpp = w[i] * (dw[i] - inner);  // dL/dp * p
    dgam += dpp * log_u[i];
    dws[i] = linear && ws[i] == F(0) ? (dw[i] - inner) * inv_ws_sum
                                      : dpp * gamma / (u[i] * scale);
  }
  *dgamma = dgam;
  // Shift: ds[q] = sum_i dws[i] wg[i + R - q]; dwg[k] = sum_q s[q] dws[k - R + q].
  std::fill(dwg, dwg + N, F(0));
  for (int64_t q = 0; q < c.S; ++q) {
    ds[q] = shift_dot(dws, wg, R - q, N);
    shift_add(dwg, dws, s[q], q - R, N);
  }
  // Interpolation and the content softmax.
  F dg = 0, sd = 0;
#pragma omp simd reduction(+ : dg, sd)
  for (int64_t i = 0; i < N; ++i) {
    dg += dwg[i] * (wc[i] - w_prev[i]);
    dw_prev[i] = dwg[i] - gate * dwg[i];
    sd += gate * dwg[i] * wc[i];
  }
  *dgate = dg;
  const F ksq = dot(key, key, M);
  F db = 0, tsum = 0;
#pragma omp simd reduction(+ : db, tsum)
  for (int64_t i = 0; i < N; ++i) {
    const F dz = wc[i] * (gate * dwg[i] - sd);
    db += dz * cos[i];
    const F dcos = dz * beta;
    ddot[i] = dcos / std::sqrt((ksq + F(kEps)) * (msq[i] + F(kEps)));
    const F t = dcos * cos[i];
    tsum += t;
    dmsq[i] += F(-0.5) * t / (msq[i] + F(kEps));
  }
  *dbeta = db;
  return F(-0.5) * tsum / (ksq + F(kEps));
}

// The pass over the rows of one memory that the backward of its heads k = first .. first + n - 1
// leaves (`address_backward`: ddot [n, N], dksq [n]), with its squared norms' (dmsq) and, for
// the read heads, the reads' (reads[h][j] = w[h] . mem[j]; dread [n, M], w [n, N]; none for the
// write heads): for each row j, d key_h[j] = ddot_h . mem[j] + 2 key_h[j] dksq_h, and
// dmem[j] += 2 mem[j] dmsq + sum_h (key_h[j] ddot_h + dread_h[j] w_h). n >= 1 (the callers: the
// read heads, of which there is at least one, and the write heads where there are any).
template <typename F>
void rows_backward(const Cfg& c, const F* mem, const F* dmsq, int64_t first, int64_t n,
                   const F* act, const F* ddot, const F* dksq, const F* dread, const F* w,
                   F* dact, F* dmem) {
  const int64_t M = c.M, N = c.N;
  for (int64_t j = 0; j < M; ++j) {
    const F* row = mem + j * N;
    F* drow = dmem + j * N;
    for (int64_t h = 0; h < n; ++h) {
      const F kj = act[c.key(first + h) + j];
      dact[c.key(first + h) + j] = dot(ddot + h * N, row, N) + F(2) * kj * dksq[h];
    }
    // The first head with the norms in the same loop, the others (if any) after it.
    for (int64_t h = 0; h < n; ++h) {
      const F kj = act[c.key(first + h) + j];
      const F* dd = ddot + h * N;
      if (dread) {
        const F rj = dread[h * M + j];
        const F* wh = w + h * N;
        if (h == 0) {
#pragma omp simd
          for (int64_t i = 0; i < N; ++i) {
            drow[i] += F(2) * row[i] * dmsq[i] + (kj * dd[i] + rj * wh[i]);
          }
        } else {
#pragma omp simd
          for (int64_t i = 0; i < N; ++i) drow[i] += kj * dd[i] + rj * wh[i];
        }
      } else if (h == 0) {
#pragma omp simd
        for (int64_t i = 0; i < N; ++i) drow[i] += F(2) * row[i] * dmsq[i] + kj * dd[i];
      } else {
#pragma omp simd
        for (int64_t i = 0; i < N; ++i) drow[i] += kj * dd[i];
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Forward.
// ------------------------------------------------------------------------------------------------

// Erase, then add (eq. 3, 4): mem = mem_prev * prod_k (1 - e_k w_k) + sum_k a_k w_k, and the
// new rows' squared norms msq, in one pass over the memory: a vector of rows at a time, its
// products, sums and squared norm kept in registers over the M columns.
template <typename F>
void erase_add(const Cfg& c, const F* act, const F* ww, const F* mem_prev, F* mem, F* msq) {
  using V = Vec<F>;
  const int64_t M = c.M, N = c.N;
  for (int64_t i = 0; i < N; i += V::size()) {
    const int64_t n = std::min<int64_t>(V::size(), N - i);
    V sq(F(0));
    for (int64_t j = 0; j < M; ++j) {
      V keep(F(1)), add(F(0));
      for (int64_t k = 0; k < c.Hw; ++k) {
        const V w = load_n(ww + k * N + i, n);
        keep = keep * (V(F(1)) - V(act[c.erase(k) + j]) * w);
        add = fmadd(V(act[c.add(k) + j]), w, add);
      }
      const V row = fmadd(load_n(mem_prev + j * N + i, n), keep, add);
      store_n(row, mem + j * N + i, n);
      sq = fmadd(row, row, sq);
    }
    store_n(sq, msq + i, n);
  }
}

template <typename F>
void write_and_read(const Cfg& c, const F* raw, const F* mem_prev, const F* msq_prev,
                    const F* wr_prev, const F* ww_prev, F* mem, F* msq, F* wr, F* ww, F* reads,
                    F* addr, F* act, F* work) {
  const int64_t M = c.M, N = c.N;
  activate(c, raw, act);
  if (c.Hw) {
    for (int64_t k = 0; k < c.Hw; ++k) {
      address(c, mem_prev, msq_prev, ww_prev + k * N, act + c.key(k), act[c.beta(k)],
              act[c.gate(k)], act + c.shift(k), act[c.gamma(k)], addr + k * N, work, ww + k * N);
    }
    erase_add(c, act, ww, mem_prev, mem, msq);
  } else {
    std::copy(mem_prev, mem_prev + M * N, mem);
    std::copy(msq_prev, msq_prev + N, msq);
  }
  for (int64_t r = 0; r < c.Hr; ++r) {
    const int64_t k = c.Hw + r;
    address(c, mem, msq, wr_prev + r * N, act + c.key(k), act[c.beta(k)], act[c.gate(k)],
            act + c.shift(k), act[c.gamma(k)], addr + k * N, work, wr + r * N);
    for (int64_t j = 0; j < M; ++j) reads[r * M + j] = dot(wr + r * N, mem + j * N, N);
  }
}

// ------------------------------------------------------------------------------------------------
// Backward.
// ------------------------------------------------------------------------------------------------

// Erase, then add, of one write head backward (Hw = 1; mem = mem_prev (1 - e w) + a w, per row
// j with e = e[j], a = a[j]), in one pass over the rows: dmem, the gradient of mem, becomes that of
// mem_prev in place; adds to dw; writes d erase and d add.
template <typename F>
void erase_add_backward1(const Cfg& c, const F* mem_prev, const F* w, const F* act, F* dact,
                         F* dmem, F* dw) {
  const int64_t M = c.M, N = c.N;
  for (int64_t j = 0; j < M; ++j) {
    const F* prow = mem_prev + j * N;
    F* drow = dmem + j * N;
    const F e = act[c.erase(0) + j], a = act[c.add(0) + j];
    F da = 0, de = 0;
#pragma omp simd reduction(+ : da, de)
    for (int64_t i = 0; i < N; ++i) {
      const F d = drow[i], p = prow[i], wi = w[i];
      da += d * wi;
      de += d * p * wi;
      dw[i] += d * (a - e * p);
      drow[i] = d * (F(1) - e * wi);
    }
    dact[c.add(0) + j] = da;
    dact[c.erase(0) + j] = -de;
  }
}

// The same for any number of write heads: mem = mem_prev * keep + sum_k a_k w_k, keep = prod_k
// f_k, f_k = 1 - e_k w_k. erase_tmp: scratch of (Hw + 3) N.
template <typename F>
void erase_add_backward(const Cfg& c, const F* mem_prev, const F* ww, const F* act, F* dact,
                        F* dmem, F* dwt, F* erase_tmp) {
  const int64_t M = c.M, N = c.N, Hw = c.Hw;
  F* before = erase_tmp;              // [Hw + 1, N]: before[k] = prod_{k' < k} f_k'
  F* after = erase_tmp + (Hw + 1) * N;  // [N]: prod_{k' > k} f_k'
  F* dkeep = after + N;                 // [N]
  for (int64_t k = 0; k < Hw; ++k) combine_rows(dmem, act + c.add(k), M, N, dwt + k * N, true);
  for (int64_t j = 0; j < M; ++j) {
    const F* drow = dmem + j * N;
    const F* prow = mem_prev + j * N;
    for (int64_t k = 0; k < Hw; ++k) dact[c.add(k) + j] = dot(ww + k * N, drow, N);
    std::fill(before, before + N, F(1));
    std::fill(after, after + N, F(1));
    for (int64_t k = 0; k < Hw; ++k) {
      const F e = act[c.erase(k) + j];
      const F* w = ww + k * N;
      const F* b0 = before + k * N;
      F* b1 = before + (k + 1) * N;
#pragma omp simd
      for (int64_t i = 0; i < N; ++i) b1[i] = b0[i] * (F(1) - e * w[i]);
    }
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) dkeep[i] = drow[i] * prow[i];
    for (int64_t k = Hw - 1; k >= 0; --k) {  // d f_k = dkeep * prod of the other f
      const F e = act[c.erase(k) + j];
      const F* w = ww + k * N;
      const F* b0 = before + k * N;
      F* dw = dwt + k * N;
      F de = 0;
#pragma omp simd reduction(+ : de)
      for (int64_t i = 0; i < N; ++i) {
        const F df = dkeep[i] * b0[i] * after[i];
        dw[i] -= df * e;
        de += df * w[i];
        after[i] *= F(1) - e * w[i];
      }
      dact[c.erase(k) + j] -= de;
    }
    F* dprev = dmem + j * N;  // becomes the gradient of mem_prev, in place
    const F* keep = before + Hw * N;
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) dprev[i] = drow[i] * keep[i];
  }
}

// One step's heads backward for one batch element. Scratch: tmp 5N, dwt max(Hw, 1) N (the
// weightings' gradients), erase_tmp (Hw + 3) N, ddot max(Hr, Hw) (N + 1).
template <typename F>
void heads_backward(const Cfg& c, const F* raw, const F* mem_prev, const F* msq_prev,
                    const F* mem, const F* msq, const F* wr_prev, const F* ww_prev,
                    const F* wr, const F* ww, const F* addr, const F* dr_out, F* dreads,
                    F* dwr, F* dww, F* dmem, F* draw, F* act, F* dact, F* dmsq, F* tmp,
                    F* dwt, F* erase_tmp, F* ddot) {
  const int64_t M = c.M, N = c.N, Hr = c.Hr, Hw = c.Hw;
  F* dksq = ddot + std::max(Hr, Hw) * N;
  activate(c, raw, act);
  std::fill(dact, dact + c.P, F(0));
  // Read: reads[r][j] = sum_i wr[r][i] mem[j][i]; its addressing, then one pass over the rows.
  std::fill(dmsq, dmsq + N, F(0));
  for (int64_t r = 0; r < Hr; ++r) {
    F* dread = dreads + r * M;
    for (int64_t j = 0; j < M; ++j) dread[j] += dr_out[r * M + j];
    F* dw = dwt;  // dwr + dreads . mem
    std::copy(dwr + r * N, dwr + (r + 1) * N, dw);
    combine_rows(mem, dread, M, N, dw, true);
    const int64_t k = Hw + r;
    dksq[r] = address_backward(c, dw, msq, wr_prev + r * N, act + c.key(k), act[c.beta(k)],
                               act[c.gate(k)], act + c.shift(k), act[c.gamma(k)], wr + r * N,
                               addr + k * N, dwr + r * N, dact + c.beta(k), dact + c.gate(k),
                               dact + c.shift(k), dact + c.gamma(k), dmsq, ddot + r * N, tmp);
  }
  rows_backward(c, mem, dmsq, Hw, Hr, act, ddot, dksq, dreads, wr, dact, dmem);
  if (Hw) {
    for (int64_t k = 0; k < Hw; ++k) std::copy(dww + k * N, dww + (k + 1) * N, dwt + k * N);
    if (Hw == 1) {
      erase_add_backward1(c, mem_prev, ww, act, dact, dmem, dwt);
    } else {
      erase_add_backward(c, mem_prev, ww, act, dact, dmem, dwt, erase_tmp);
    }
    std::fill(dmsq, dmsq + N, F(0));
    for (int64_t k = 0; k < Hw; ++k) {
      dksq[k] = address_backward(c, dwt + k * N, msq_prev, ww_prev + k * N, act + c.key(k),
                                 act[c.beta(k)], act[c.gate(k)], act + c.shift(k),
                                 act[c.gamma(k)], ww + k * N, addr + k * N, dww + k * N,
                                 dact + c.beta(k), dact + c.gate(k), dact + c.shift(k),
                                 dact + c.gamma(k), dmsq, ddot + k * N, tmp);
    }
    rows_backward<F>(c, mem_prev, dmsq, 0, Hw, act, ddot, dksq, nullptr, nullptr, dact, dmem);
  }
  activate_backward(c, raw, act, dact, draw);
}

}  // namespace

template <typename F>
void forward(const View<F>& v, const Params<F>& p, int64_t T, bool keep_all) {
  const Cfg& c = v.c;
  const int64_t B = c.B, C = c.C, G = v.gate_width();
  const int64_t M = c.M, N = c.N;
  const F* xp = p.xpre;
  const F* r0 = p.reads0;
  const F* wpp = p.wp;
  const F* bpp = p.bp;
  const std::vector<const F*>& wts = p.weights;
  const std::vector<const F*>& bs = p.biases;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s0 = keep_all ? t : t % 2, s1 = keep_all ? t + 1 : (t + 1) % 2;
    const int64_t st = keep_all ? t : 0;
    // Controller, layer by layer: z = [input, h_prev], then one matmul over the batch.
    for (int64_t l = 0; l < c.L; ++l) {
      const int64_t in = v.in_width(l), Z = v.z_width(l);
      F* z = v.z(l, st);
      const F* input = l > 0 ? v.h(s1, l - 1) : t == 0 ? r0 : v.reads(t - 1);
      for (int64_t b = 0; b < B; ++b) {
        std::copy(input + b * in, input + (b + 1) * in, z + b * Z);
        if (c.lstm) std::copy(v.h(s0, l) + b * C, v.h(s0, l) + (b + 1) * C, z + b * Z + in);
      }
      F* a = v.act(l, st);
      if (l == 0) {
        std::copy(xp + t * B * G, xp + (t + 1) * B * G, a);
      } else {
        fill_rows(a, bs[l - 1], B, G);
      }
      gemm<F>(false, true, B, G, Z, z, wts[l], F(1), a);  // a += z W^T
      F* hn = v.h(s1, l);
      if (c.lstm) {  // gates (i, f, o, g), kept activated for the backward
        lstm_gates(a, v.cell(s0, l), v.cell(s1, l), hn, B, C);
      } else {
        map1(a, a, B * C, [](Vec<F> x) { return x.tanh(); });
        std::copy(a, a + B * C, hn);
      }
    }
    const F* top = v.h(s1, c.L - 1);
    std::copy(top, top + B * C, v.hs(t));
    // Head layer, then each batch element's heads, memory and reads.
    F* raw = v.raw(st);
    fill_rows(raw, bpp, B, c.P);
    gemm<F>(false, true, B, c.P, C, top, wpp, F(1), raw);
    const F *mp = v.mem(s0), *qp = v.msq(s0), *wrp = v.wr(s0), *wwp = v.ww(s0);
    F *mn = v.mem(s1), *qn = v.msq(s1), *wrn = v.wr(s1), *wwn = v.ww(s1);
    F* rd = v.reads(t);
    F* ad = v.addr(st);
    {
      std::vector<F> act(c.P), work(3 * N);
      for (int64_t b = 0; b < B; ++b) {
        write_and_read(c, raw + b * c.P, mp + b * M * N, qp + b * N, wrp + b * c.Hr * N,
                       wwp + b * c.Hw * N, mn + b * M * N, qn + b * N, wrn + b * c.Hr * N,
                       wwn + b * c.Hw * N, rd + b * c.Hr * M, ad + b * c.H * N, act.data(),
                       work.data());
      }
    }
  }
}

template <typename F>
void backward(const View<F>& v, const Params<F>& p, int64_t T, const F* dho,
              const F* dro_all, Carried<F>& g, const std::vector<F*>& dpres, F* draw_all) {
  const Cfg& c = v.c;
  const int64_t B = c.B, C = c.C, M = c.M, N = c.N, G = v.gate_width();
  const int64_t Hr = c.Hr, Hw = c.Hw;
  const std::vector<const F*>& wts = p.weights;
  const F* wpp = p.wp;
  std::vector<F> dtop(B * C), dlow(B * C), tc(C);
  std::vector<std::vector<F>> dz;
  for (int64_t l = 0; l < c.L; ++l) dz.emplace_back(v.z_size[l]);
  F *dmem = g.dmem, *dwr = g.dwr, *dww = g.dww, *dreads = g.dreads, *gdh = g.dh, *gdc = g.dc;
  for (int64_t t = T - 1; t >= 0; --t) {
    const F* rawp = v.raw(t);
    const F *mp = v.mem(t), *qp = v.msq(t), *mn = v.mem(t + 1), *qn = v.msq(t + 1);
    const F *wrp = v.wr(t), *wwp = v.ww(t), *wrn = v.wr(t + 1), *wwn = v.ww(t + 1);
    const F* ad = v.addr(t);
    const F* dro = dro_all + t * B * Hr * M;
    F* drw = draw_all + t * B * c.P;
    {
      std::vector<F> act(c.P), dact(c.P), dmsq(N), tmp(5 * N), dwt(std::max<int64_t>(Hw, 1) * N),
          erase_tmp((Hw + 3) * N), ddot(std::max(Hr, Hw) * (N + 1));
      for (int64_t b = 0; b < B; ++b) {
        heads_backward(c, rawp + b * c.P, mp + b * M * N, qp + b * N, mn + b * M * N,
                       qn + b * N, wrp + b * Hr * N, wwp + b * Hw * N, wrn + b * Hr * N,
                       wwn + b * Hw * N, ad + b * c.H * N, dro + b * Hr * M,
                       dreads + b * Hr * M, dwr + b * Hr * N, dww + b * Hw * N,
                       dmem + b * M * N, drw + b * c.P, act.data(), dact.data(), dmsq.data(),
                       tmp.data(), dwt.data(), erase_tmp.data(), ddot.data());
      }
    }
    // The top layer's output feeds the head layer (and, for an LSTM, the next step).
    std::copy(dho + t * B * C, dho + (t + 1) * B * C, dtop.data());
    gemm<F>(false, false, B, C, c.P, drw, wpp, F(1), dtop.data());  // += draw wp
    F* dh = dtop.data();
    for (int64_t l = c.L - 1; l >= 0; --l) {
      const int64_t in = v.in_width(l), Z = v.z_width(l);
      F* dgl = gdh + l * B * C;
      F* dp = dpres[l] + t * B * G;
      const F* ap = v.act(l, t);
      if (c.lstm) {
#pragma omp simd
        for (int64_t e = 0; e < B * C; ++e) dh[e] += dgl[e];
        lstm_gates_backward(ap, v.cell(t, l), v.cell(t + 1, l), dh, gdc + l * B * C, dp, tc.data(),
                            B, C);
      } else {
#pragma omp simd
        for (int64_t e = 0; e < B * C; ++e) dp[e] = dh[e] * (F(1) - ap[e] * ap[e]);
      }
      F* dzl = dz[l].data();
      gemm<F>(false, false, B, Z, G, dp, wts[l], F(0), dzl);  // dz = dpre W
      F* dest = l > 0 ? dlow.data() : dreads;  // the gradient of the layer's input
      for (int64_t b = 0; b < B; ++b) {
        std::copy(dzl + b * Z, dzl + b * Z + in, dest + b * in);
        if (c.lstm) std::copy(dzl + b * Z + in, dzl + (b + 1) * Z, dgl + b * C);
      }
      dh = dlow.data();
    }
  }
}

}  // namespace torch_ntm
