// The native engine's declarations: the static sizes of a call, raw views of its buffers, and the
// two kernels (ntm.h). No torch header is included, so that the build takes seconds; a batch's
// elements run one after the other on the calling thread.
//
// Shapes: T steps, B batch, L controller layers of C units, memory of N rows of width M kept
// transposed per batch element ([M, N], so that loops over rows are contiguous), H = Hw + Hr
// heads (write heads first), S = 2R + 1 shifts, P head-layer outputs permuted into blocks by
// activation [tanh | sigmoid | softplus | softmax] (engines/ntm.py's `head_blocks`; where each
// head's fields lie comes with the call, in `NTMCall`).

#pragma once

#include "calls.h"  // generated from engines/ntm.py's NTMCall

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace torch_ntm {

// Static sizes of one call (from its NTMCall).
struct Cfg {
  bool lstm;
  int64_t L, B, C, Hr, Hw, H, M, N, S, R, P;
  int64_t o_sig, o_sp, o_sm;  // where the sigmoid, softplus and softmax blocks start
  double beta_cap, gamma_cap, tiny;
  NTMCall call;  // field_start and field_width: where each head's fields lie

  // Where head k's field f lies in the permuted head layer output (k < Hw: write heads).
  int64_t at(HeadField f, int64_t k) const {
    return k < Hw ? call.field_start[2 * f] + k * call.field_width[f]
                  : call.field_start[2 * f + 1] + (k - Hw) * call.field_width[f];
  }
  int64_t key(int64_t k) const { return at(KEY, k); }
  int64_t add(int64_t k) const { return at(ADD, k); }
  int64_t erase(int64_t k) const { return at(ERASE, k); }
  int64_t gate(int64_t k) const { return at(GATE, k); }
  int64_t beta(int64_t k) const { return at(BETA, k); }
  int64_t gamma(int64_t k) const { return at(GAMMA, k); }
  int64_t shift(int64_t k) const { return at(SHIFT, k); }
};

// The static sizes of a call, checked: Python checks shapes before it calls; this catches a
// description that does not fit this library before any pointer is read.
inline Cfg config(const NTMCall& d) {
  const int64_t widths = sizeof(d.field_width) / sizeof(d.field_width[0]);
  bool fields_ok = true;
  for (int64_t f = 0; f < widths; ++f) {
    fields_ok = fields_ok && d.field_width[f] >= 1 && d.field_start[2 * f] >= -1 &&
                d.field_start[2 * f + 1] >= -1;
  }
  if (d.steps < 1 || d.batch < 1 || d.layers < 1 || d.hidden < 1 || d.read_heads < 1 ||
      d.write_heads < 0 || d.width < 1 || d.rows < 1 || d.shifts < 1 || d.shifts % 2 == 0 ||
      d.shifts > d.rows || d.block_end[0] < 0 || d.block_end[1] < d.block_end[0] ||
      d.block_end[2] < d.block_end[1] || d.block_end[3] < d.block_end[2] || !fields_ok) {
    throw std::invalid_argument(
        "sizes out of range (T " + std::to_string(d.steps) + ", B " + std::to_string(d.batch) +
        ", L " + std::to_string(d.layers) + ", C " + std::to_string(d.hidden) + ", Hr " +
        std::to_string(d.read_heads) + ", Hw " + std::to_string(d.write_heads) + ", M " +
        std::to_string(d.width) + ", N " + std::to_string(d.rows) + ", S " +
        std::to_string(d.shifts) + ")");
  }
  Cfg c;
  c.call = d;
  c.B = d.batch;
  c.L = d.layers;
  c.C = d.hidden;
  c.Hr = d.read_heads;
  c.Hw = d.write_heads;
  c.H = c.Hr + c.Hw;
  c.M = d.width;
  c.N = d.rows;
  c.S = d.shifts;
  c.R = (c.S - 1) / 2;
  c.o_sig = d.block_end[0];
  c.o_sp = d.block_end[1];
  c.o_sm = d.block_end[2];
  c.P = d.block_end[3];
  c.lstm = d.lstm != 0;
  c.beta_cap = d.beta_cap;
  c.gamma_cap = d.gamma_cap;
  c.tiny = d.tiny;
  return c;
}

// The buffers of one call (NTMCall's table in engines/calls.py, read by the generated
// NTMCallBuffers), with the sizes, and the controller's state by slot and layer.
template <typename F>
struct View : NTMCallBuffers<F> {
  // Reads the buffers' addresses from p on (`end`: how many).
  View(const NTMCall& d, const uintptr_t* p) : c(config(d)), end(this->take(d, p)) {}
  Cfg c;
  size_t end;

  // Widths per batch row, from the buffer table's shapes (engines/calls.py's NTMCall.buffers):
  // layer l's matmul input z = [input, h_prev] (h_prev for an LSTM), its input, its gates.
  int64_t z_width(int64_t l) const { return this->z_size[l] / c.B; }
  int64_t in_width(int64_t l) const { return z_width(l) - (c.lstm ? c.C : 0); }
  int64_t gate_width() const { return this->act_size[0] / c.B; }

  F* h(int64_t slot, int64_t l) const { return NTMCallBuffers<F>::h(slot) + l * c.B * c.C; }
  F* cell(int64_t slot, int64_t l) const {
    return NTMCallBuffers<F>::cell(slot) + l * c.B * c.C;
  }
};

// A kernel's addresses: those `A` numbers (the generated NTMCallForward or NTMCallBackward), the
// buffers (read into `v`), then the lists (engines/calls.py's NTMCall says which).
template <typename F, typename A>
struct Addresses {
  Addresses(const NTMCall& d, const uintptr_t* p)
      : p(p), v(d, p + A::count), lists(p + A::count + v.end) {}
  F* operator[](size_t i) const { return reinterpret_cast<F*>(p[i]); }
  // Entry i of the lists, all of them counted together.
  F* list(int64_t i) const { return reinterpret_cast<F*>(lists[i]); }

  const uintptr_t* p;
  const View<F> v;
  const uintptr_t* lists;
};

// The parameters and inputs of a call.
template <typename F>
struct Params {
  const F* xpre;  // [T, B, G] layer 0's input projection, bias included
  std::vector<const F*> weights;  // per layer [G, in + C] (LSTM, gates i, f, o, g) or [C, in]
  std::vector<const F*> biases;   // per layer >= 1, [G]
  const F* wp;                    // [P, C] the head layer, rows permuted
  const F* bp;                    // [P]
  const F* reads0;                // [B, Hr, M] the initial reads
};

// The gradients carried back from step t + 1 to step t, updated in place.
template <typename F>
struct Carried {
  F* dmem;    // [B, M, N]
  F* dwr;     // [B, Hr, N]
  F* dww;     // [B, Hw, N]
  F* dreads;  // [B, Hr, M]
  F* dh;      // [L, B, C] (LSTM)
  F* dc;      // [L, B, C] (LSTM)
};

// All T steps forward, into the buffers (every step's if keep_all, else two slots of state and
// one of intermediates; `hs` and `reads` always every step's).
template <typename F>
void forward(const View<F>& v, const Params<F>& p, int64_t T, bool keep_all);

// All T steps backward from the buffers of every step: ``dh_out [T, B, C]`` and
// ``dreads_out [T, B, Hr, M]`` are the gradients of each step's outputs; writes each layer's
// ``dpre [T, B, G]`` and ``draw [T, B, P]``, and leaves the initial state's gradients in g.
template <typename F>
void backward(const View<F>& v, const Params<F>& p, int64_t T, const F* dh_out,
              const F* dreads_out, Carried<F>& g, const std::vector<F*>& dpre, F* draw);

}  // namespace torch_ntm
