// Building blocks shared by the architectures' forward passes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/kv_cells.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "model/arch.h"

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

// The last layer's queries and FFN matter only for the rows whose outputs are wanted (the cache rows of every
// token are still written): a prompt's other tokens skip them, as llama.cpp's graphs skip them through
// inp_out_ids. A model compacts those rows of its residual stream to the front (compact_rows) and runs the rest
// of the last layer on `ub`, the ubatch of those tokens alone, whose output rows are then 0, 1, ...
struct WantedRows {
    std::vector<int32_t> tokens, pos, cells, identity;
    std::vector<SeqSet> seqs;
    UBatch ub;  // over the vectors above

    // The tokens of `from` at its output rows (ascending), with from's hidden_out and first_of_call.
    void build(const UBatch &from);
};

// x[i] = x[rows[i]] for rows ascending (so no row is read after it is overwritten); x is [T, width].
void compact_rows(float *x, int64_t width, std::span<const int32_t> rows);

}  // namespace sparrow
