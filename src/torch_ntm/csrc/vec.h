// The vector type of the kernels: `Vec<F>`, the few operations of ATen's `at::vec::Vectorized`
// that they use, with the same instructions and the same SLEEF functions (those torch's library
// exports), so that with AVX2 and AVX512 every result is bit for bit the one ATen's type gives
// (checked on both, float32 and float64, NTM and MANN, forward and backward). Without ATen's
// headers: parsing them took about 2 s of each translation unit's 3-5 s, on the first command's
// critical path (the library is built when first used).
//
// The instruction set is the build's CPU_CAPABILITY (engines/library.py passes torch's own):
// AVX512, AVX2, or none: ATen's generic type, 32 bytes of scalars with std::exp and friends, whose
// results differ from ATen's in the last bits (the compiler's choices, ~1e-7 of float32).

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

namespace torch_ntm {

// ------------------------------------------------------------------------------------------------
// One instruction set's table: the raw register type and each operation's instruction. `Vec`
// below builds the type the kernels use from a table.
// ------------------------------------------------------------------------------------------------

#if defined(CPU_CAPABILITY_AVX512)

extern "C" {  // SLEEF's dispatchers in libtorch_cpu, the functions Vectorized's exp, log, tanh call
__m512 Sleef_expf16_u10(__m512) __attribute__((const));
__m512 Sleef_logf16_u10(__m512) __attribute__((const));
__m512 Sleef_tanhf16_u10(__m512) __attribute__((const));
__m512d Sleef_expd8_u10(__m512d) __attribute__((const));
__m512d Sleef_logd8_u10(__m512d) __attribute__((const));
__m512d Sleef_tanhd8_u10(__m512d) __attribute__((const));
}

struct FloatISA {
  using F = float;
  using Raw = __m512;
  static constexpr int64_t W = 16;
  static Raw set1(F x) { return _mm512_set1_ps(x); }
  static Raw load(const F* p) { return _mm512_loadu_ps(p); }
  static Raw load(const F* p, int64_t n) { return _mm512_maskz_loadu_ps((1ULL << n) - 1, p); }
  static void store(F* p, Raw v) { _mm512_storeu_ps(p, v); }
  static void store(F* p, Raw v, int64_t n) { _mm512_mask_storeu_ps(p, (1ULL << n) - 1, v); }
  static Raw add(Raw a, Raw b) { return _mm512_add_ps(a, b); }
  static Raw sub(Raw a, Raw b) { return _mm512_sub_ps(a, b); }
  static Raw mul(Raw a, Raw b) { return _mm512_mul_ps(a, b); }
  static Raw div(Raw a, Raw b) { return _mm512_div_ps(a, b); }
  static Raw fmadd(Raw a, Raw b, Raw c) { return _mm512_fmadd_ps(a, b, c); }
  static Raw neg(Raw a) { return _mm512_xor_ps(_mm512_set1_ps(-0.f), a); }
  // The larger, or NaN (all ones) where either is.
  static Raw maximum(Raw a, Raw b) {
    const __mmask16 nan = _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
    return _mm512_or_ps(_mm512_max_ps(a, b),
                        _mm512_castsi512_ps(_mm512_mask_set1_epi32(_mm512_set1_epi32(0), nan,
                                                                   0xFFFFFFFF)));
  }
  static Raw exp(Raw a) { return Sleef_expf16_u10(a); }
  static Raw log(Raw a) { return Sleef_logf16_u10(a); }
  static Raw tanh(Raw a) { return Sleef_tanhf16_u10(a); }
  static F reduce_add(Raw a) { return _mm512_reduce_add_ps(a); }
  static void stream(F* p, Raw v) { _mm512_stream_ps(p, v); }
  static bool any_below(Raw a, Raw b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ) != 0; }
};

struct DoubleISA {
  using F = double;
  using Raw = __m512d;
  static constexpr int64_t W = 8;
  static Raw set1(F x) { return _mm512_set1_pd(x); }
  static Raw load(const F* p) { return _mm512_loadu_pd(p); }
  static Raw load(const F* p, int64_t n) { return _mm512_maskz_loadu_pd((1ULL << n) - 1, p); }
  static void store(F* p, Raw v) { _mm512_storeu_pd(p, v); }
  static void store(F* p, Raw v, int64_t n) { _mm512_mask_storeu_pd(p, (1ULL << n) - 1, v); }
  static Raw add(Raw a, Raw b) { return _mm512_add_pd(a, b); }
  static Raw sub(Raw a, Raw b) { return _mm512_sub_pd(a, b); }
  static Raw mul(Raw a, Raw b) { return _mm512_mul_pd(a, b); }
  static Raw div(Raw a, Raw b) { return _mm512_div_pd(a, b); }
  static Raw fmadd(Raw a, Raw b, Raw c) { return _mm512_fmadd_pd(a, b, c); }
  static Raw neg(Raw a) { return _mm512_xor_pd(_mm512_set1_pd(-0.), a); }
  static Raw maximum(Raw a, Raw b) {
    const __mmask8 nan = _mm512_cmp_pd_mask(a, b, _CMP_UNORD_Q);
    return _mm512_or_pd(_mm512_max_pd(a, b),
                        _mm512_castsi512_pd(_mm512_mask_set1_epi64(_mm512_set1_epi64(0), nan,
                                                                   0xFFFFFFFFFFFFFFFF)));
  }
  static Raw exp(Raw a) { return Sleef_expd8_u10(a); }
  static Raw log(Raw a) { return Sleef_logd8_u10(a); }
  static Raw tanh(Raw a) { return Sleef_tanhd8_u10(a); }
  static F reduce_add(Raw a) { return _mm512_reduce_add_pd(a); }
  static void stream(F* p, Raw v) { _mm512_stream_pd(p, v); }
  static bool any_below(Raw a, Raw b) { return _mm512_cmp_pd_mask(a, b, _CMP_LT_OQ) != 0; }
};

#elif defined(CPU_CAPABILITY_AVX2)

extern "C" {
__m256 Sleef_expf8_u10(__m256) __attribute__((const));
__m256 Sleef_logf8_u10(__m256) __attribute__((const));
__m256 Sleef_tanhf8_u10(__m256) __attribute__((const));
__m256d Sleef_expd4_u10(__m256d) __attribute__((const));
__m256d Sleef_logd4_u10(__m256d) __attribute__((const));
__m256d Sleef_tanhd4_u10(__m256d) __attribute__((const));
}

struct FloatISA {
  using F = float;
  using Raw = __m256;
  static constexpr int64_t W = 8;
  // Lanes [0, n) of a partial load or store.
  static __m256i lanes(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(n)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Raw set1(F x) { return _mm256_set1_ps(x); }
  static Raw load(const F* p) { return _mm256_loadu_ps(p); }
  static Raw load(const F* p, int64_t n) { return _mm256_maskload_ps(p, lanes(n)); }
  static void store(F* p, Raw v) { _mm256_storeu_ps(p, v); }
  static void store(F* p, Raw v, int64_t n) { _mm256_maskstore_ps(p, lanes(n), v); }
  static Raw add(Raw a, Raw b) { return _mm256_add_ps(a, b); }
  static Raw sub(Raw a, Raw b) { return _mm256_sub_ps(a, b); }
  static Raw mul(Raw a, Raw b) { return _mm256_mul_ps(a, b); }
  static Raw div(Raw a, Raw b) { return _mm256_div_ps(a, b); }
  static Raw fmadd(Raw a, Raw b, Raw c) { return _mm256_fmadd_ps(a, b, c); }
  static Raw neg(Raw a) { return _mm256_xor_ps(_mm256_set1_ps(-0.f), a); }
  static Raw maximum(Raw a, Raw b) {
    return _mm256_or_ps(_mm256_max_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  static Raw exp(Raw a) { return Sleef_expf8_u10(a); }
  static Raw log(Raw a) { return Sleef_logf8_u10(a); }
  static Raw tanh(Raw a) { return Sleef_tanhf8_u10(a); }
  // ATen's tree for float: halves, then pairs of pairs, then pairs.
  static F reduce_add(Raw v) {
    v = _mm256_add_ps(v, _mm256_permute2f128_ps(v, v, 0x1));
    v = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0x4E));
    v = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0xB1));
    return _mm256_cvtss_f32(v);
  }
  static void stream(F* p, Raw v) { _mm256_stream_ps(p, v); }
  static bool any_below(Raw a, Raw b) {
    return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ)) != 0;
  }
};

struct DoubleISA {
  using F = double;
  using Raw = __m256d;
  static constexpr int64_t W = 4;
  static __m256i lanes(int64_t n) {
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3));
  }
  static Raw set1(F x) { return _mm256_set1_pd(x); }
  static Raw load(const F* p) { return _mm256_loadu_pd(p); }
  static Raw load(const F* p, int64_t n) { return _mm256_maskload_pd(p, lanes(n)); }
  static void store(F* p, Raw v) { _mm256_storeu_pd(p, v); }
  static void store(F* p, Raw v, int64_t n) { _mm256_maskstore_pd(p, lanes(n), v); }
  static Raw add(Raw a, Raw b) { return _mm256_add_pd(a, b); }
  static Raw sub(Raw a, Raw b) { return _mm256_sub_pd(a, b); }
  static Raw mul(Raw a, Raw b) { return _mm256_mul_pd(a, b); }
  static Raw div(Raw a, Raw b) { return _mm256_div_pd(a, b); }
  static Raw fmadd(Raw a, Raw b, Raw c) { return _mm256_fmadd_pd(a, b, c); }
  static Raw neg(Raw a) { return _mm256_xor_pd(_mm256_set1_pd(-0.), a); }
  static Raw maximum(Raw a, Raw b) {
    return _mm256_or_pd(_mm256_max_pd(a, b), _mm256_cmp_pd(a, b, _CMP_UNORD_Q));
  }
  static Raw exp(Raw a) { return Sleef_expd4_u10(a); }
  static Raw log(Raw a) { return Sleef_logd4_u10(a); }
  static Raw tanh(Raw a) { return Sleef_tanhd4_u10(a); }
  // ATen's generic reduction: lane 0 plus each other lane in turn.
  static F reduce_add(Raw v) {
    F lanes[W];
    _mm256_storeu_pd(lanes, v);
    F acc = lanes[0];
    for (int64_t l = 1; l < W; ++l) acc += lanes[l];
    return acc;
  }
  static void stream(F* p, Raw v) { _mm256_stream_pd(p, v); }
  static bool any_below(Raw a, Raw b) {
    return _mm256_movemask_pd(_mm256_cmp_pd(a, b, _CMP_LT_OQ)) != 0;
  }
};

#else  // ATen's generic vector: 32 bytes of scalars, each operation lane by lane

template <typename Real>
struct ScalarISA {
  using F = Real;
  static constexpr int64_t W = 32 / sizeof(F);
  struct Raw {
    F x[W];
  };
  template <typename Op>
  static Raw each(const Op& op) {
    Raw r;
    for (int64_t l = 0; l < W; ++l) r.x[l] = op(l);
    return r;
  }
  static Raw set1(F v) { return each([&](int64_t) { return v; }); }
  static Raw load(const F* p) { return load(p, W); }
  static Raw load(const F* p, int64_t n) { return each([&](int64_t l) { return l < n ? p[l] : F(0); }); }
  static void store(F* p, Raw v) { store(p, v, W); }
  static void store(F* p, Raw v, int64_t n) { std::memcpy(p, v.x, n * sizeof(F)); }
  static Raw add(Raw a, Raw b) { return each([&](int64_t l) { return a.x[l] + b.x[l]; }); }
  static Raw sub(Raw a, Raw b) { return each([&](int64_t l) { return a.x[l] - b.x[l]; }); }
  static Raw mul(Raw a, Raw b) { return each([&](int64_t l) { return a.x[l] * b.x[l]; }); }
  static Raw div(Raw a, Raw b) { return each([&](int64_t l) { return a.x[l] / b.x[l]; }); }
  static Raw fmadd(Raw a, Raw b, Raw c) { return add(mul(a, b), c); }
  static Raw neg(Raw a) { return each([&](int64_t l) { return -a.x[l]; }); }
  static Raw maximum(Raw a, Raw b) {
    return each([&](int64_t l) { return a.x[l] > b.x[l] || std::isnan(a.x[l]) ? a.x[l] : b.x[l]; });
  }
  static Raw exp(Raw a) { return each([&](int64_t l) { return std::exp(a.x[l]); }); }
  static Raw log(Raw a) { return each([&](int64_t l) { return std::log(a.x[l]); }); }
  static Raw tanh(Raw a) { return each([&](int64_t l) { return std::tanh(a.x[l]); }); }
  static F reduce_add(Raw v) {
    F acc = v.x[0];
    for (int64_t l = 1; l < W; ++l) acc += v.x[l];
    return acc;
  }
  static void stream(F* p, Raw v) { store(p, v); }
  static bool any_below(Raw a, Raw b) {
    for (int64_t l = 0; l < W; ++l) {
      if (a.x[l] < b.x[l]) return true;
    }
    return false;
  }
};
using FloatISA = ScalarISA<float>;
using DoubleISA = ScalarISA<double>;

#endif

// ------------------------------------------------------------------------------------------------
// The vector type: W lanes of F, its arithmetic, and ATen's names for the rest.
// ------------------------------------------------------------------------------------------------

template <typename ISA>
class VecOf {
 public:
  using F = typename ISA::F;
  using Raw = typename ISA::Raw;

  static constexpr int64_t size() { return ISA::W; }

  VecOf() = default;
  VecOf(Raw v) : v_(v) {}          // NOLINT: a register is a vector
  VecOf(F x) : v_(ISA::set1(x)) {}  // NOLINT: every lane x, as Vectorized(x)
  operator Raw() const { return v_; }

  static VecOf loadu(const F* p) { return ISA::load(p); }
  // n < size() values; the other lanes are 0.
  static VecOf loadu(const F* p, int64_t n) { return ISA::load(p, n); }
  void store(F* p) const { ISA::store(p, v_); }
  // The first n < size() lanes only.
  void store(F* p, int64_t n) const {
    if (n > 0) ISA::store(p, v_, n);
  }

  VecOf neg() const { return ISA::neg(v_); }
  VecOf reciprocal() const { return ISA::div(ISA::set1(F(1)), v_); }
  VecOf exp() const { return ISA::exp(v_); }
  VecOf log() const { return ISA::log(v_); }
  VecOf tanh() const { return ISA::tanh(v_); }
  F reduce_add() const { return ISA::reduce_add(v_); }
  // Stored at p, aligned to the vector, bypassing the cache.
  static void stream(F* p, VecOf v) { ISA::stream(p, v.v_); }

  friend VecOf operator+(VecOf a, VecOf b) { return ISA::add(a.v_, b.v_); }
  friend VecOf operator-(VecOf a, VecOf b) { return ISA::sub(a.v_, b.v_); }
  friend VecOf operator*(VecOf a, VecOf b) { return ISA::mul(a.v_, b.v_); }
  friend VecOf operator/(VecOf a, VecOf b) { return ISA::div(a.v_, b.v_); }
  // a * b + c, rounded once where the instruction set has a fused multiply-add.
  friend VecOf fmadd(VecOf a, VecOf b, VecOf c) { return ISA::fmadd(a.v_, b.v_, c.v_); }
  // The larger of each pair of lanes; NaN where either is NaN.
  friend VecOf maximum(VecOf a, VecOf b) { return ISA::maximum(a.v_, b.v_); }
  // Whether a < b in any lane (false where either is NaN).
  friend bool any_below(VecOf a, VecOf b) { return ISA::any_below(a.v_, b.v_); }

 private:
  Raw v_;
};

template <typename F>
using Vec = VecOf<std::conditional_t<std::is_same_v<F, float>, FloatISA, DoubleISA>>;

// out[i] = op(a[i]) for n values, a vector at a time (ATen's vec::map: the last, partial vector
// loaded with zeros past the end and stored in part).
template <typename F, typename Op>
inline void map1(F* out, const F* a, int64_t n, const Op& op) {
  using V = Vec<F>;
  int64_t i = 0;
  for (; i + V::size() <= n; i += V::size()) op(V::loadu(a + i)).store(out + i);
  if (i < n) op(V::loadu(a + i, n - i)).store(out + i, n - i);
}

// dst[0, n) = src[0, n) with stores that bypass the cache (no read of dst's lines first), where
// dst is aligned to the vector: data written once and read much later (a step's memory copied to
// the history that only the backward reads). `stream_fence` after the last, before others read.
template <typename F>
void stream_copy(const F* src, F* dst, int64_t n) {
  using V = Vec<F>;
  int64_t i = 0;
  if (reinterpret_cast<uintptr_t>(dst) % (V::size() * sizeof(F)) == 0) {
    for (; i + V::size() <= n; i += V::size()) V::stream(dst + i, V::loadu(src + i));
  }
  std::copy(src + i, src + n, dst + i);
}

inline void stream_fence() {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  _mm_sfence();
#endif
}

}  // namespace torch_ntm
