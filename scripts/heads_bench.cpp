// The native library's heads alone (addressing, erase and add, read; forward and backward), timed
// per sequence and step at a given batch size: scripts/heads_bench.py builds and calls this. It
// includes the library's source, whose step functions are internal to it.

#include "kernels.cpp"

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

// The paper's copy model's heads (one read, one write head, memory N x 20, three shifts) over T
// steps of B sequences, with every step's state kept as training keeps it. out[0], out[1]: the
// least over `repeats` of the forward's and the backward's nanoseconds per sequence and step.
extern "C" int heads_bench(int64_t B, int64_t T, int64_t N, int64_t repeats, double* out) {
  Cfg c{};
  c.lstm = true;
  c.L = 1;
  c.B = B;
  c.C = 100;
  c.Hr = 1;
  c.Hw = 1;
  c.H = 2;
  c.M = 20;
  c.N = N;
  c.S = 3;
  c.R = 1;
  c.o_sig = (2 * c.Hw + c.Hr) * c.M;       // tanh: write key, add, read key
  c.o_sp = c.o_sig + c.Hw * c.M + c.H;      // sigmoid: erase, the gates
  c.o_sm = c.o_sp + 2 * c.H;                // softplus: betas, gammas
  c.P = c.o_sm + c.H * c.S;                 // softmax: shifts
  c.tiny = 1.17549435e-38;
  const int64_t M = c.M, MN = M * N, P = c.P;
  std::mt19937 gen(0);
  std::normal_distribution<F> normal(0, 0.5f);
  std::vector<std::vector<F>> mem(T + 1, std::vector<F>(B * MN));
  std::vector<std::vector<F>> cosines(T, std::vector<F>(B * c.H * N));  // what the forward keeps
  std::vector<F> msq((T + 1) * B * N), wr((T + 1) * B * N, F(1) / N), ww((T + 1) * B * N, F(1) / N);
  std::vector<F> raw(T * B * P), reads(T * B * M), dro(T * B * M), draw(T * B * P);
  std::vector<F> dreads(B * M), dwr(B * N), dww(B * N), dmem(B * MN);
  for (auto& x : mem[0]) x = normal(gen);
  for (auto& x : raw) x = normal(gen);
  for (auto& x : dro) x = normal(gen) * F(0.01);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < N; ++i) {
      F s = 0;
      for (int64_t j = 0; j < M; ++j) s += mem[0][b * MN + j * N + i] * mem[0][b * MN + j * N + i];
      msq[b * N + i] = s;
    }
  }
  std::vector<F> act(P), dact(P), work(3 * N), dmsq(N), tmp(5 * N), dwt(N), erase_tmp(4 * N),
      ddot(2 * (N + 1));
  double fwd = 1e30, bwd = 1e30;
  for (int64_t rep = 0; rep < repeats; ++rep) {
    auto start = std::chrono::steady_clock::now();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t s0 = t * B + b, s1 = (t + 1) * B + b;
        torch_ntm::write_and_read(c, &raw[s0 * P], &mem[t][b * MN], &msq[s0 * N], &wr[s0 * N],
                                  &ww[s0 * N], &mem[t + 1][b * MN], &msq[s1 * N], &wr[s1 * N],
                                  &ww[s1 * N], &reads[s0 * M], &cosines[t][b * c.H * N], act.data(),
                                  work.data());
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
            c, &raw[s0 * P], &mem[t][b * MN], &msq[s0 * N], &mem[t + 1][b * MN], &msq[s1 * N],
            &wr[s0 * N], &ww[s0 * N], &wr[s1 * N], &ww[s1 * N], &cosines[t][b * c.H * N],
            &dro[s0 * M], &dreads[b * M], &dwr[b * N], &dww[b * N], &dmem[b * MN], &draw[s0 * P],
            act.data(), dact.data(), dmsq.data(), tmp.data(), dwt.data(), erase_tmp.data(),
            ddot.data());
      }
    }
    bwd = std::min(bwd, seconds_since(start));
  }
  out[0] = fwd * 1e9 / double(T * B);
  out[1] = bwd * 1e9 / double(T * B);
  return 0;
}
