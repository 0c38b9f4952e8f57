// Building blocks shared by the architectures' forward passes.
#pragma once

#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "kernels/ops.h"

namespace sparrow {

// out = down(silu(gate x) * up x)     x: [T, n_in]; gate_buf, up_buf: [T, n_ff]; out: [T, n_out]
void swiglu_ffn(ThreadPool &pool, OpScratch &op, const WeightMatrix &gate, const WeightMatrix &up,
                const WeightMatrix &down, const float *x, int64_t n_tokens, float *gate_buf, float *up_buf, float *out);

// logits[i] = output (rms_norm(x[rows[i]]) * norm): only the rows that asked for logits reach the head.
//   x: [T, n_embd]; scratch: [rows.size(), n_embd]; logits: [rows.size(), n_vocab]
//   hidden_out: when not null, [rows.size(), n_embd] receives the normed rows (the embeddings)
void output_head(ThreadPool &pool, OpScratch &op, const WeightMatrix &output, const float *norm, float eps,
                 const float *x, int64_t n_embd, std::span<const int32_t> rows, float *scratch, float *logits,
                 float *hidden_out = nullptr);

}  // namespace sparrow
