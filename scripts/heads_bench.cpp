// The native library's heads alone (addressing, erase and add, read; forward and backward), timed
// per sequence and step at a given batch size: scripts/heads_bench.py builds and calls this. It
// includes the library's header (ntm.h), whose step functions are internal to it.

#include "ntm.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

namespace {

using torch_ntm::Cfg;
using F = float;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// The heads of the model whose static sizes the library's call would get (engines/ntm.py's
// `_call`, the layout of its head parameters included) over its T steps of B sequences,
// with every step's state kept as training keeps it. out[0], out[1]: the least over `repeats` of
// the forward's and the backward's nanoseconds per sequence and step.
extern "C" int heads_bench(const torch_ntm::NTMCall* d, int64_t repeats, double* out) {
  const Cfg c = torch_ntm::config(*d);
  const int64_t T = d->steps, B = c.B, N = c.N;
  const int64_t M = c.M, MN = M * N, P = c.P;
  std::mt19937 gen(0);
  std::normal_distribution<F> normal(0, 0.5f);
  std::vector<std::vector<F>> mem(T + 1, std::vector<F>(B * MN));
  std::vector<std::vector<F>> cosines(T, std::vector<F>(B * c.H * N));  // what the forward keeps
  std::vector<F> msq((T + 1) * B * N), wr((T + 1) * B * c.Hr * N, F(1) / N),
      ww((T + 1) * B * c.Hw * N, F(1) / N);
  std::vector<F> raw(T * B * P), reads(T * B * c.Hr * M), dro(T * B * c.Hr * M), draw(T * B * P);
  std::vector<F> dreads(B * c.Hr * M), dwr(B * c.Hr * N), dww(B * c.Hw * N), dmem(B * MN);
  for (auto& x : mem[0]) x = normal(gen);  // the raw head parameters and memory: N(0, 0.5)
  for (auto& x : raw) x = normal(gen);
  for (auto& x : dro) x = normal(gen) * F(0.01);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < N; ++i) {
      F s = 0;
      for (int64_t j = 0; j < M; ++j) s += mem[0][b * MN + j * N + i] * mem[0][b * MN + j * N + i];
      msq[b * N + i] = s;
    }
  }
  std::vector<F> act(P), dact(P), work(3 * N), dmsq(N), tmp(5 * N),
      dwt(std::max<int64_t>(c.Hw, 1) * N), erase_tmp((c.Hw + 3) * N),
      ddot(std::max(c.Hr, c.Hw) * (N + 1));
  const int64_t Hr = c.Hr, Hw = c.Hw;
  double fwd = 1e30, bwd = 1e30;
  for (int64_t rep = 0; rep < repeats; ++rep) {
    auto start = std::chrono::steady_clock::now();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t s0 = t * B + b, s1 = (t + 1) * B + b;
        torch_ntm::write_and_read(
            c, raw.data() + s0 * P, mem[t].data() + b * MN, msq.data() + s0 * N,
            wr.data() + s0 * Hr * N, ww.data() + s0 * Hw * N, mem[t + 1].data() + b * MN,
            msq.data() + s1 * N, wr.data() + s1 * Hr * N, ww.data() + s1 * Hw * N,
            reads.data() + s0 * Hr * M, cosines[t].data() + b * c.H * N, act.data(), work.data());
      }
    }
    fwd = std::min(fwd, seconds_since(start));
    std::fill(dmem.begin(), dmem.end(), F(0));
    std::fill(dwr.begin(), dwr.end(), F(0));
    std::fill(dww.begin(), dww.end(), F(0));
    std::fill(dreads.begin(), dreads.end(), F(0));
    start = std::chrono::steady_clock::now();
    for (int64_t t = T - 1; t >= 0; --t) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t s0 = t * B + b, s1 = (t + 1) * B + b;
        torch_ntm::heads_backward(
            c, raw.data() + s0 * P, mem[t].data() + b * MN, msq.data() + s0 * N,
            mem[t + 1].data() + b * MN, msq.data() + s1 * N, wr.data() + s0 * Hr * N,
            ww.data() + s0 * Hw * N, wr.data() + s1 * Hr * N, ww.data() + s1 * Hw * N,
            cosines[t].data() + b * c.H * N, dro.data() + s0 * Hr * M, dreads.data() + b * Hr * M,
            dwr.data() + b * Hr * N, dww.data() + b * Hw * N, dmem.data() + b * MN,
            draw.data() + s0 * P, act.data(), dact.data(), dmsq.data(), tmp.data(), dwt.data(),
            erase_tmp.data(), ddot.data());
      }
    }
    bwd = std::min(bwd, seconds_since(start));
  }
  out[0] = fwd * 1e9 / double(T * B);
  out[1] = bwd * 1e9 / double(T * B);
  return 0;
}
