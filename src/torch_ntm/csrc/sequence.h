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
#include <vector>

namespace torch_ntm {

// Static sizes of one call (from its NTMCall).
struct Cfg {
  bool lstm;
  int64_t L, B, C, Hr, Hw, H, M, N, S, R, P;
  int64_t o_sig, o_sp, o_sm;  // where the sigmoid, softplus and softmax blocks start
  double beta_cap, gamma_cap, tiny;
  NTMCall call;  // field_start and field_width: where each head's fields lie

  int64_t in_size(int64_t layer) const { return layer == 0 ? Hr * M : C; }
  int64_t z_size(int64_t layer) const { return in_size(layer) + (lstm ? C : 0); }
  int64_t gate_size() const { return lstm ? 4 * C : C; }
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

// The buffers of one call (engines/ntm.py's `_buffers`, with their shapes) as raw pointers, and where
// one slot's (T + 1 of state) or one step's (T of intermediates) part of each begins.
template <typename F>
struct View {
  Cfg c;
  F *h_{}, *c_{}, *msq_{}, *wr_{}, *ww_{}, *hs_{}, *reads_{}, *raw_{};
  // The memories and addressing intermediates, the largest buffers, one block per slot or step:
  // blocks of a few MB are reused from the heap between calls, where one block of all steps
  // would be mapped afresh (and page-faulted) on every call.
  std::vector<F*> mem_{}, addr_{};
  std::vector<F*> z_{}, act_{};

  F* h(int64_t slot, int64_t l) const { return h_ + (slot * c.L + l) * c.B * c.C; }
  F* cell(int64_t slot, int64_t l) const { return c_ + (slot * c.L + l) * c.B * c.C; }
  F* mem(int64_t slot) const { return mem_[slot]; }
  F* msq(int64_t slot) const { return msq_ + slot * c.B * c.N; }
  F* wr(int64_t slot) const { return wr_ + slot * c.B * c.Hr * c.N; }
  F* ww(int64_t slot) const { return ww_ + slot * c.B * c.Hw * c.N; }
  F* hs(int64_t t) const { return hs_ + t * c.B * c.C; }
  F* reads(int64_t t) const { return reads_ + t * c.B * c.Hr * c.M; }
  F* raw(int64_t st) const { return raw_ + st * c.B * c.P; }
  F* addr(int64_t st) const { return addr_[st]; }
  F* z(int64_t l, int64_t st) const { return z_[l] + st * c.B * c.z_size(l); }
  F* act(int64_t l, int64_t st) const { return act_[l] + st * c.B * c.gate_size(); }
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
