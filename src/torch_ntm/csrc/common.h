// What every native model's kernels share (ntm.h for the NTM, mann.cpp and dnc.cpp for the MANN
// and the DNC): small vectorised loops over contiguous rows, the matmuls (torch's BLAS, and a
// batch-invariant one), and the LSTM controller's gates forward and backward (the C entry points'
// part is entry.h). No torch header (the vector type is vec.h's), so that a build takes seconds.

#pragma once

#include "calls.h"  // generated: the engines' calls, kEps, kSoftplusThreshold
#include "entry.h"

#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>


namespace torch_ntm {

// ------------------------------------------------------------------------------------------------
// Small loops. `#pragma omp simd` (with -fopenmp-simd) lets the reductions vectorise.
// ------------------------------------------------------------------------------------------------

template <typename F>
inline F dot(const F* a, const F* b, int64_t n) {
  F acc = 0;
  if (n >= 4 * Vec<F>::size()) {
    using V = Vec<F>;
    constexpr int64_t W = V::size();
    V s0(F(0)), s1(F(0)), s2(F(0)), s3(F(0));
    int64_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
      s0 = fmadd(V::loadu(a + i), V::loadu(b + i), s0);
      s1 = fmadd(V::loadu(a + i + W), V::loadu(b + i + W), s1);
      s2 = fmadd(V::loadu(a + i + 2 * W), V::loadu(b + i + 2 * W), s2);
      s3 = fmadd(V::loadu(a + i + 3 * W), V::loadu(b + i + 3 * W), s3);
    }
    F lanes[W];
    ((s0 + s1) + (s2 + s3)).store(lanes);
    for (int64_t l = 0; l < W; ++l) acc += lanes[l];
    a += i;
    b += i;
    n -= i;
  }
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <typename F>
inline F sum(const F* a, int64_t n) {
  F acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i];
  return acc;
}

// max(init, a[0], ..., a[n-1]), vectorised (std::max in a loop is not: its NaN rule).
template <typename F>
inline F max_of(const F* a, int64_t n, F init) {
  using V = Vec<F>;
  constexpr int64_t W = V::size();
  V m(init);
  int64_t i = 0;
  for (; i + W <= n; i += W) m = maximum(m, V::loadu(a + i));
  F lanes[W];
  m.store(lanes);
  F out = init;
  for (int64_t l = 0; l < W; ++l) out = lanes[l] > out ? lanes[l] : out;
  for (; i < n; ++i) out = a[i] > out ? a[i] : out;
  return out;
}

// w := softmax(w) over its n entries, in place: the largest subtracted, exp, normalised (the
// content weightings of all three models).
template <typename F>
inline void softmax_inplace(F* w, int64_t n) {
  const F mx = max_of(w, n, -std::numeric_limits<F>::infinity());
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) w[i] -= mx;
  map1(w, w, n, [](Vec<F> v) { return v.exp(); });
  const F inv_total = F(1) / sum(w, n);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) w[i] *= inv_total;
}

// The backward of a content weighting w = softmax(beta cos) over n rows, cos[i] = (key . row_i)
// ik inv[i] (ik, inv[i]: the inverse norms of the key and of row i), from its gradient dw and
// inner = w . dw: writes ddot[i], the gradient of key . row_i, and t[i] = dcos[i] cos[i], of
// which the norms' gradients are made; returns (d beta, the sum of t).
template <typename F>
inline std::pair<F, F> content_softmax_backward(const F* w, const F* dw, F inner, const F* cos,
                                                F beta, F ik, const F* inv, int64_t n, F* ddot,
                                                F* t) {
  F dbeta = 0, tsum = 0;
#pragma omp simd reduction(+ : dbeta, tsum)
  for (int64_t i = 0; i < n; ++i) {
    const F dz = w[i] * (dw[i] - inner);
    dbeta += dz * cos[i];
    const F dcos = dz * beta;
    ddot[i] = dcos * ik * inv[i];
    t[i] = dcos * cos[i];
    tsum += t[i];
  }
  return {dbeta, tsum};
}

// A vector of n <= W values at p (the lanes past n are 0 on load and not stored).
template <typename F>
inline Vec<F> load_n(const F* p, int64_t n) {
  return n == Vec<F>::size() ? Vec<F>::loadu(p) : Vec<F>::loadu(p, n);
}
template <typename F>
inline void store_n(const Vec<F>& v, F* p, int64_t n) {
  if (n == Vec<F>::size()) {
    v.store(p);
  } else {
    v.store(p, n);
  }
}

// Whether (a, i) comes before (b, j) in torch's stable ascending sort (NaN after every number):
// the order in which the MANN picks its least-used rows and the DNC its free list.
template <typename F>
inline bool before(F a, int64_t i, F b, int64_t j) {
  if (std::isnan(a)) return std::isnan(b) && i < j;
  if (std::isnan(b)) return true;
  return a < b || (a == b && i < j);
}

// Argument i of a kernel's pointer array, as a read-only F array.
template <typename F>
const F* arg(const uintptr_t* p, size_t i) { return reinterpret_cast<const F*>(p[i]); }

// Whether fields given as (start, width) tile [0, total): sorted, each starts where the one
// before ends and the last ends at total. How a call's head fields are checked, wherever it puts
// them.
inline bool tiles(std::vector<std::pair<int64_t, int64_t>> spans, int64_t total) {
  std::sort(spans.begin(), spans.end());
  int64_t end = 0;
  for (const auto& [first, width] : spans) {
    if (first != end) return false;
    end = first + width;
  }
  return end == total;
}

// The sizes of every MANN or DNC call (its generated struct's steps, batch, controller, rows and
// inputs: X, the controller's input width besides the reads) and whether it keeps every step's
// state (as a backward needs), checked.
struct CallSizes {
  int64_t T, B, C, N, X;
  bool keep_all;

  int64_t G() const { return 4 * C; }  // the LSTM's gates
};

template <typename Call>
CallSizes call_sizes(const Call& d, const char* model) {
  if (d.steps < 1 || d.batch < 1 || d.controller < 1 || d.rows < 1 || d.inputs < 0) {
    throw std::invalid_argument(std::string(model) + ": invalid sizes");
  }
  return {d.steps, d.batch, d.controller, d.rows, d.inputs, d.keep_all != 0};
}

// The LSTM controller's side of a MANN's or DNC's forward call, where the generated
// `{Call}Forward` enum `A` has them: the LSTM's input side [T, B, 4C] with its biases (gates i, f,
// g, o, `nn.LSTMCell`'s order), its weights as the cell holds them (W_ih [4C, X + Z - C], whose
// last Z - C columns read the reads, and W_hh [4C, C]), the head (interface) layer [P, C] and
// its bias [P], and the first step's h [B, C] and reads [B, Z - C].
template <typename F>
struct Controller {
  const F *xpre, *wih, *whh, *wp, *bp, *h0, *reads0;
};

template <typename F, typename A>
Controller<F> controller_args(const uintptr_t* p) {
  return {arg<F>(p, A::xpre), arg<F>(p, A::wih), arg<F>(p, A::whh), arg<F>(p, A::wp),
          arg<F>(p, A::bp),   arg<F>(p, A::h0),  arg<F>(p, A::reads0)};
}

template <typename F>
inline F sigmoid(F x) { return F(1) / (F(1) + std::exp(-x)); }

// Elementwise maps (vec.h's map1) take these: SLEEF's exp, log and tanh, as torch's own CPU
// kernels use, so that the transcendental functions of a step vectorise too.

template <typename F>
inline Vec<F> vsigmoid(Vec<F> x) { return (Vec<F>(F(1)) + x.neg().exp()).reciprocal(); }


// y[i] (+)= sum_j x[j] a[j][i] for a [rows, n] row-major: a memory's rows combined (cosine
// numerators, gradients of weightings). Four vector registers of y at a time stay in registers
// over all rows, instead of a load and store of y per row.
template <typename F>
void combine_rows(const F* a, const F* x, int64_t rows, int64_t n, F* y, bool accumulate) {
  using V = Vec<F>;
  constexpr int64_t W = V::size();
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    V y0 = accumulate ? V::loadu(y + i) : V(F(0));
    V y1 = accumulate ? V::loadu(y + i + W) : V(F(0));
    V y2 = accumulate ? V::loadu(y + i + 2 * W) : V(F(0));
    V y3 = accumulate ? V::loadu(y + i + 3 * W) : V(F(0));
    for (int64_t j = 0; j < rows; ++j) {
      const V xj(x[j]);
      const F* r = a + j * n + i;
      y0 = fmadd(xj, V::loadu(r), y0);
      y1 = fmadd(xj, V::loadu(r + W), y1);
      y2 = fmadd(xj, V::loadu(r + 2 * W), y2);
      y3 = fmadd(xj, V::loadu(r + 3 * W), y3);
    }
    y0.store(y + i);
    y1.store(y + i + W);
    y2.store(y + i + 2 * W);
    y3.store(y + i + 3 * W);
  }
  // The columns left, a vector (the last one partial) at a time: a scalar loop here would read
  // each column with a stride of n (all of it, where n < 4 vectors: a DNC's 32-wide rows).
  for (; i < n; i += W) {
    const int64_t m = std::min<int64_t>(W, n - i);
    V acc = accumulate ? load_n(y + i, m) : V(F(0));
    for (int64_t j = 0; j < rows; ++j) acc = fmadd(V(x[j]), load_n(a + j * n + i, m), acc);
    store_n(acc, y + i, m);
  }
}

// functional.softplus (x itself above kSoftplusThreshold) and its derivative.
template <typename F>
inline F softplus(F x) { return x > F(kSoftplusThreshold) ? x : std::log1p(std::exp(x)); }
template <typename F>
inline F softplus_grad(F x) { return x > F(kSoftplusThreshold) ? F(1) : sigmoid(x); }

// Row-major out[m, n] = A[m, k] B[k, n] + beta out, with A given as [k, m] if ta and B as [n, k]
// if tb, each matrix's rows `ld*` apart: BLAS's gemm where torch exports it (its MKL), else a
// plain loop.
template <typename F>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const F* a, int64_t lda_,
          const F* b, int64_t ldb_, F beta, F* out, int64_t ldc_) {
  const int im = m, in = n, ik = k, lda = lda_, ldb = ldb_, ldc = ldc_;
  const F one = 1;
  // Column-major BLAS: out^T [n, m] = op(B)^T op(A)^T.
  const char* opa = ta ? "T" : "N";
  const char* opb = tb ? "T" : "N";
  if constexpr (std::is_same_v<F, float>) {
    if (sgemm_) return sgemm_(opb, opa, &in, &im, &ik, &one, b, &ldb, a, &lda, &beta, out, &ldc);
  } else {
    if (dgemm_) return dgemm_(opb, opa, &in, &im, &ik, &one, b, &ldb, a, &lda, &beta, out, &ldc);
  }
  // No BLAS exported: the plain loop (`has_blas` tells Python, which logs it once).
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      F acc = 0;
      for (int64_t q = 0; q < k; ++q) {
        acc += (ta ? a[q * lda + i] : a[i * lda + q]) * (tb ? b[j * ldb + q] : b[q * ldb + j]);
      }
      F& o = out[i * ldc + j];
      o = beta == F(0) ? acc : beta * o + acc;  // as BLAS: 0 * NaN
    }
  }
}

// `gemm` of whole matrices (each row as long as the matrix is wide).
template <typename F>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const F* a, const F* b, F beta,
          F* out) {
  gemm(ta, tb, m, n, k, a, ta ? m : k, b, tb ? k : n, beta, out, n);
}

// Below this many rows `gemm_rows_invariant` puts its lanes across B's rows, not A's.
constexpr int64_t kFewRows = 4;

// One lane of Vec's fmadd on scalars: fused where the instruction set has it (the build's
// CPU_CAPABILITY), a product then a sum where it has not, as vec.h's generic type.
template <typename F>
inline F lane_fmadd(F a, F b, F c) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  return std::fma(a, b, c);
#else
  const F product = a * b;
  return product + c;
#endif
}

// A square block of S x S entries of w (rows `ws` apart) transposed into t (rows `ts` apart), in
// registers where the build has AVX2 (S = 8 floats or 4 doubles: one register a row), S = 8 in
// scalars else. A copy: the same values, whatever the path.
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
template <typename F>
constexpr int64_t kTransposeBlock = 32 / sizeof(F);

inline void transpose_block(const float* w, int64_t ws, float* t, int64_t ts) {
  __m256 r[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(w + i * ws);
  for (int i = 0; i < 8; i += 2) {  // pairs of rows interleaved
    u[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    u[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // then quadruples: each 128-bit lane one column of 4 rows
    r[i] = _mm256_shuffle_ps(u[i], u[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {  // rows 0-3's lane and rows 4-7's make a column
    _mm256_storeu_ps(t + i * ts, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(t + (i + 4) * ts, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

inline void transpose_block(const double* w, int64_t ws, double* t, int64_t ts) {
  __m256d r[4], u[4];
  for (int i = 0; i < 4; ++i) r[i] = _mm256_loadu_pd(w + i * ws);
  u[0] = _mm256_unpacklo_pd(r[0], r[1]), u[1] = _mm256_unpackhi_pd(r[0], r[1]);
  u[2] = _mm256_unpacklo_pd(r[2], r[3]), u[3] = _mm256_unpackhi_pd(r[2], r[3]);
  _mm256_storeu_pd(t, _mm256_permute2f128_pd(u[0], u[2], 0x20));
  _mm256_storeu_pd(t + ts, _mm256_permute2f128_pd(u[1], u[3], 0x20));
  _mm256_storeu_pd(t + 2 * ts, _mm256_permute2f128_pd(u[0], u[2], 0x31));
  _mm256_storeu_pd(t + 3 * ts, _mm256_permute2f128_pd(u[1], u[3], 0x31));
}
#else
template <typename F>
constexpr int64_t kTransposeBlock = 8;

template <typename F>
void transpose_block(const F* w, int64_t ws, F* t, int64_t ts) {
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 8; ++j) t[j * ts + i] = w[i * ws + j];
}
#endif

// w [rows, cols] (rows `ld` apart) transposed into t [cols, rows]: whole blocks by
// `transpose_block` (a MANN's 800 x 360 floats in ~0.1 ms where scalar tiles took ~0.5), the
// edges in scalars.
template <typename F>
void transpose_into(F* t, int64_t rows, int64_t cols, const F* w, int64_t ld) {
  constexpr int64_t S = kTransposeBlock<F>;
  const int64_t whole_rows = rows / S * S, whole_cols = cols / S * S;
  for (int64_t r = 0; r < whole_rows; r += S) {
    for (int64_t q = 0; q < whole_cols; q += S) {
      transpose_block(w + r * ld + q, ld, t + q * rows + r, rows);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {  // the edges: columns past the last block, then rows
    for (int64_t q = r < whole_rows ? whole_cols : 0; q < cols; ++q) {
      t[q * rows + r] = w[r * ld + q];
    }
  }
}

// `gemm_rows_invariant` (below) for a few rows given Bt = B^T [k, n]: lanes across B's rows,
// each entry's steps the same; 8 vectors of a row at a time (then 4, then one).
template <typename F>
void gemm_few_rows_t(int64_t m, int64_t n, int64_t k, const F* a, int64_t lda, const F* bt,
                     F* out) {
  using V = Vec<F>;
  constexpr int64_t W = V::size();
  for (int64_t i = 0; i < m; ++i) {
    const F* ai = a + i * lda;
    F* oi = out + i * n;
    int64_t j = 0;
    auto block = [&](auto vectors) {  // columns [j, j + BV W): BV accumulators in flight
      constexpr int64_t BV = decltype(vectors)::value;
      V acc[BV];
      for (int64_t v = 0; v < BV; ++v) acc[v] = V(F(0));
      for (int64_t q = 0; q < k; ++q) {
        const V av(ai[q]);
        for (int64_t v = 0; v < BV; ++v) {
          acc[v] = fmadd(av, V::loadu(bt + q * n + j + v * W), acc[v]);
        }
      }
      for (int64_t v = 0; v < BV; ++v) (V::loadu(oi + j + v * W) + acc[v]).store(oi + j + v * W);
      j += BV * W;
    };
    while (j + 8 * W <= n) block(std::integral_constant<int64_t, 8>{});
    if (j + 4 * W <= n) block(std::integral_constant<int64_t, 4>{});
    for (; j < n; j += W) {
      const int64_t lanes = std::min(W, n - j);
      V acc(F(0));
      for (int64_t q = 0; q < k; ++q) acc = fmadd(V(ai[q]), V::loadu(bt + q * n + j, lanes), acc);
      (V::loadu(oi + j, lanes) + acc).store(oi + j, lanes);
    }
  }
}

// `gemm_rows_invariant` (below) for a few rows (a batch of 1 to 3) without B^T: each entry's
// steps in scalars, 8 entries of a row at a time, B read in its own layout.
template <typename F>
void gemm_few_rows(int64_t m, int64_t n, int64_t k, const F* a, int64_t lda, const F* b,
                   int64_t ldb, F* out) {
  constexpr int64_t BJ = 8;
  for (int64_t i = 0; i < m; ++i) {
    const F* ai = a + i * lda;
    int64_t j0 = 0;
    for (; j0 + BJ <= n; j0 += BJ) {
      F acc[BJ] = {};
      for (int64_t q = 0; q < k; ++q) {
        for (int64_t j = 0; j < BJ; ++j) acc[j] = lane_fmadd(ai[q], b[(j0 + j) * ldb + q], acc[j]);
      }
      for (int64_t j = 0; j < BJ; ++j) out[i * n + j0 + j] += acc[j];
    }
    for (; j0 < n; ++j0) {
      F acc = 0;
      for (int64_t q = 0; q < k; ++q) acc = lane_fmadd(ai[q], b[j0 * ldb + q], acc);
      out[i * n + j0] += acc;
    }
  }
}

// out[m, n] += A[m, k] B[n, k]^T, each entry summed in one fixed order whatever m and wherever its
// row falls: acc = 0, then acc = fma(A[i, q], B[j, q], acc) for q = 0 .. k - 1 (one vector lane
// per entry), then out[i, j] += acc. So a batch row gets the same bits alone as in any batch: BLAS
// does not promise that (gemv at m = 1, blocked kernels above, ~1e-7 apart), and the MANN's and
// the DNC's usages, sorted each step, turn such differences into another row allocated when
// usages that are equal in exact arithmetic round apart. The lanes run across A's rows (A
// transposed into a thread's buffer, padded to whole vectors; blocks of 2 vectors of rows x 4
// columns, or 1 x 8, keep 8 accumulators in flight), or, for fewer than kFewRows rows (a batch
// of 1), across B's rows when the caller has B^T (`bt`, `gemm_few_rows_t`: the steps' weights,
// transposed once a call) or else in scalars (`gemm_few_rows`), so that no lane is padding.
// A's and B's rows are `lda` and `ldb` apart (B^T's rows n apart).
template <typename F>
void gemm_rows_invariant(int64_t m, int64_t n, int64_t k, const F* a, int64_t lda, const F* b,
                         int64_t ldb, F* out, const F* bt = nullptr) {
  using V = Vec<F>;
  constexpr int64_t W = V::size();
  if (m < kFewRows) {
    return bt ? gemm_few_rows_t(m, n, k, a, lda, bt, out)
              : gemm_few_rows(m, n, k, a, lda, b, ldb, out);
  }
  const int64_t mp = (m + W - 1) / W * W;
  thread_local std::vector<F> buffer;
  buffer.assign(k * mp, F(0));
  F* at = buffer.data();  // [k, mp]
  for (int64_t i = 0; i < m; ++i)
    for (int64_t q = 0; q < k; ++q) at[q * mp + i] = a[i * lda + q];
  // Rows [i0, i0 + BI W) x columns [j0, j0 + BJ).
  auto block = [&](int64_t i0, int64_t j0, auto bi, auto bj) {
    constexpr int64_t BI = decltype(bi)::value, BJ = decltype(bj)::value;
    V acc[BJ][BI];
    for (int64_t j = 0; j < BJ; ++j)
      for (int64_t i = 0; i < BI; ++i) acc[j][i] = V(F(0));
    for (int64_t q = 0; q < k; ++q) {
      V av[BI];
      for (int64_t i = 0; i < BI; ++i) av[i] = V::loadu(at + q * mp + i0 + i * W);
      for (int64_t j = 0; j < BJ; ++j) {
        const V bv(b[(j0 + j) * ldb + q]);
        for (int64_t i = 0; i < BI; ++i) acc[j][i] = fmadd(bv, av[i], acc[j][i]);
      }
    }
    F lanes[W];
    for (int64_t j = 0; j < BJ; ++j) {
      for (int64_t i = 0; i < BI; ++i) {
        acc[j][i].store(lanes);
        const int64_t rows = std::min(W, m - (i0 + i * W));
        for (int64_t l = 0; l < rows; ++l) out[(i0 + i * W + l) * n + j0 + j] += lanes[l];
      }
    }
  };
  using One = std::integral_constant<int64_t, 1>;
  using Two = std::integral_constant<int64_t, 2>;
  using Four = std::integral_constant<int64_t, 4>;
  using Eight = std::integral_constant<int64_t, 8>;
  // Columns [0, n) of the rows from i in blocks of `wide`, then one at a time.
  auto columns = [&](int64_t i, auto rows, auto wide) {
    constexpr int64_t BJ = decltype(wide)::value;
    int64_t j = 0;
    for (; j + BJ <= n; j += BJ) block(i, j, rows, wide);
    for (; j < n; ++j) block(i, j, rows, One{});
  };
  int64_t i = 0;
  for (; i + 2 * W <= mp; i += 2 * W) columns(i, Two{}, Four{});
  for (; i < mp; i += W) columns(i, One{}, Eight{});
}

// `gemm_rows_invariant` of whole matrices (rows as long as they are wide).
template <typename F>
void gemm_rows_invariant(int64_t m, int64_t n, int64_t k, const F* a, const F* b, F* out,
                         const F* bt = nullptr) {
  gemm_rows_invariant(m, n, k, a, k, b, k, out, bt);
}

// Rows [0, rows) of out [rows, width] set to the row `vec` [width].
template <typename F>
void fill_rows(F* out, const F* vec, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) std::copy(vec, vec + width, out + r * width);
}

// ------------------------------------------------------------------------------------------------
// The LSTM controller's cell on a batch (`nn.LSTMCell`, its gates in its order: i, f, g, o).
// ------------------------------------------------------------------------------------------------

// gates [B, 4C]: the pre-activations in, the activated gates out (kept for the backward);
// c_prev, c_new, h_new [B, C].
template <typename F>
void lstm_gates(F* gates, const F* c_prev, F* c_new, F* h_new, int64_t B, int64_t C) {
  for (int64_t b = 0; b < B; ++b) {
    F* g = gates + b * 4 * C;
    map1(g, g, 2 * C, vsigmoid<F>);
    map1(g + 2 * C, g + 2 * C, C, [](Vec<F> x) { return x.tanh(); });
    map1(g + 3 * C, g + 3 * C, C, vsigmoid<F>);
    const F* cpb = c_prev + b * C;
    F* cnb = c_new + b * C;
    F* hnb = h_new + b * C;
#pragma omp simd
    for (int64_t u = 0; u < C; ++u) cnb[u] = g[C + u] * cpb[u] + g[u] * g[2 * C + u];
    map1(hnb, cnb, C, [](Vec<F> x) { return x.tanh(); });
#pragma omp simd
    for (int64_t u = 0; u < C; ++u) hnb[u] *= g[3 * C + u];
  }
}

// `lstm_gates` backward: from dh [B, C] (the gradient of h_new) and dc [B, C] (that of c_new,
// replaced in place by that of c_prev), the gradient of the gates' pre-activations dgates [B, 4C].
// gates: the activated gates `lstm_gates` kept; tc [C]: scratch.
template <typename F>
void lstm_gates_backward(const F* gates, const F* c_prev, const F* c_new, const F* dh, F* dc,
                         F* dgates, F* tc, int64_t B, int64_t C) {
  for (int64_t b = 0; b < B; ++b) {
    const F* gt = gates + b * 4 * C;
    F* dg = dgates + b * 4 * C;
    map1(tc, c_new + b * C, C, [](Vec<F> x) { return x.tanh(); });
    const F* cpb = c_prev + b * C;
    const F* dhb = dh + b * C;
    F* dcb = dc + b * C;
#pragma omp simd
    for (int64_t u = 0; u < C; ++u) {
      const F i = gt[u], f = gt[C + u], gg = gt[2 * C + u], o = gt[3 * C + u];
      const F d = dhb[u];
      const F dcu = dcb[u] + d * o * (F(1) - tc[u] * tc[u]);
      dg[u] = dcu * gg * i * (F(1) - i);
      dg[C + u] = dcu * cpb[u] * f * (F(1) - f);
      dg[2 * C + u] = dcu * i * (F(1) - gg * gg);
      dg[3 * C + u] = d * tc[u] * o * (F(1) - o);
      dcb[u] = dcu * f;
    }
  }
}


// ------------------------------------------------------------------------------------------------
// One step of a one-layer LSTM controller fed its input's projection and the previous step's reads
// (the MANN's and the DNC's: engines/lstm_memory.py computes the input side, ``xpre = x W_ix^T +
// b``, for all steps in one call of `torch_ntm_linear_rows`), and the head layer after it. Both
// matmuls are `gemm_rows_invariant`: a batch row's bits do not depend on the batch.
// Z = RM + C: the recurrent matmul's input [reads_{t-1}, h_{t-1}] per batch row.
// ------------------------------------------------------------------------------------------------

// The weights of a step's two matmuls where the cell holds them (`Controller`): the recurrent
// W_rh = [W_r, W_hh] [4C, Z] over [reads, h] read as its two parts, W_r = W_ih[:, X:] (rows
// X + RM apart) and W_hh [4C, C], and the head layer's W_p [P, C]; for a batch of fewer than
// kFewRows also transposed once a call, into a thread's buffers (W_r^T [RM, 4C] then W_hh^T
// [C, 4C], and W_p^T [C, P]; null else), so that each step's matmuls put their lanes across the
// weights' rows (`gemm_few_rows_t`).
template <typename F>
struct ControllerWeights {
  const F *wr, *whh, *wp;
  int64_t ld;  // W_r's row stride
  const F *wrh_t = nullptr, *wp_t = nullptr;
  ControllerWeights(const CallSizes& c, int64_t RM, int64_t P, const F* wih, const F* whh_,
                    const F* wp_, bool transpose)
      : wr(wih + c.X), whh(whh_), wp(wp_), ld(c.X + RM) {
    if (!transpose || c.B >= kFewRows) return;
    const int64_t G = c.G(), C = c.C;
    thread_local std::vector<F> wrh_buffer, wp_buffer;
    wrh_buffer.resize(G * (RM + C));
    transpose_into(wrh_buffer.data(), G, RM, wr, ld);
    transpose_into(wrh_buffer.data() + RM * G, G, C, whh, C);
    wrh_t = wrh_buffer.data();
    wp_buffer.resize(P * C);
    transpose_into(wp_buffer.data(), P, C, wp, C);
    wp_t = wp_buffer.data();
  }
};

// z [B, Z] = [rprev, hprev]; act [B, 4C] = xpre_t + z W_rh^T (summed over the reads' columns,
// then over h's: the same two sums whatever the batch), then the activated gates; c_new, h [B,
// C]; raw [B, P] = bp + h W_p^T.
template <typename F>
void controller_forward(int64_t B, int64_t C, int64_t RM, int64_t P, const F* rprev,
                        const F* hprev, const F* xpre_t, const ControllerWeights<F>& w,
                        const F* bp, const F* c_prev, F* c_new, F* z, F* act, F* h, F* raw) {
  const int64_t Z = RM + C, G = 4 * C;
  for (int64_t b = 0; b < B; ++b) {
    std::copy(rprev + b * RM, rprev + (b + 1) * RM, z + b * Z);
    std::copy(hprev + b * C, hprev + (b + 1) * C, z + b * Z + RM);
  }
  std::copy(xpre_t, xpre_t + B * G, act);
  gemm_rows_invariant<F>(B, G, RM, z, Z, w.wr, w.ld, act, w.wrh_t);
  gemm_rows_invariant<F>(B, G, C, z + RM, Z, w.whh, C, act, w.wrh_t ? w.wrh_t + RM * G : nullptr);
  lstm_gates(act, c_prev, c_new, h, B, C);
  fill_rows(raw, bp, B, P);
  gemm_rows_invariant<F>(B, P, C, h, C, w.wp, C, raw, w.wp_t);
}

// `controller_forward` backward, from draw [B, P] (the head layer's outputs' gradient), dho
// [B, C] (h's, from the outputs) and the carried dh, dc, dreads [B, C], [B, C], [B, RM] (those
// of h_t, c_t and the reads r_t from the steps after; replaced in place by those of step t - 1):
// writes dgates [B, 4C]. w: the weights (`ControllerWeights`, untransposed); act, c_prev, c_new:
// the forward's; dh [B C], tc [C]: scratch.
template <typename F>
void controller_backward(int64_t B, int64_t C, int64_t RM, int64_t P, const F* draw,
                         const F* dho, const ControllerWeights<F>& w, const F* act,
                         const F* c_prev, const F* c_new, F* dh_carried, F* dc, F* dreads,
                         F* dgates, F* dh, F* tc) {
  const int64_t G = 4 * C;
#pragma omp simd
  for (int64_t e = 0; e < B * C; ++e) dh[e] = dho[e] + dh_carried[e];
  gemm<F>(false, false, B, C, P, draw, w.wp, F(1), dh);  // += draw W_p
  lstm_gates_backward(act, c_prev, c_new, dh, dc, dgates, tc, B, C);
  // The reads' and h's gradients of step t - 1: dgates [W_r, W_hh].
  gemm<F>(false, false, B, RM, G, dgates, G, w.wr, w.ld, F(0), dreads, RM);
  gemm<F>(false, false, B, C, G, dgates, G, w.whh, C, F(0), dh_carried, C);
}

}  // namespace torch_ntm
