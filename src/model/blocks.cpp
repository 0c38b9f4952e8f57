#include "model/blocks.h"

#include <algorithm>

#include "core/error.h"

namespace sparrow {

void swiglu_ffn(ThreadPool &pool, OpScratch &op, const WeightMatrix &gate, const WeightMatrix &up,
                const WeightMatrix &down, const float *x, int64_t n_tokens, float *gate_buf, float *up_buf,
                float *out) {
    matmul(pool, op, gate, x, n_tokens, gate_buf);  // [T, n_ff]
    matmul(pool, op, up, x, n_tokens, up_buf);      // [T, n_ff]
    swiglu(gate_buf, up_buf, gate_buf, n_tokens * gate.n_rows);
    matmul(pool, op, down, gate_buf, n_tokens, out);  // [T, n_out]
}

void output_head(ThreadPool &pool, OpScratch &op, const WeightMatrix &output, const float *norm, float eps,
                 const float *x, int64_t n_embd, std::span<const int32_t> rows, float *scratch, float *logits,
                 float *hidden_out) {
    const auto n_out = static_cast<int64_t>(rows.size());
    for (int64_t i = 0; i < n_out; ++i) std::copy_n(x + rows[i] * n_embd, n_embd, scratch + i * n_embd);
    rms_norm(scratch, norm, scratch, n_out, n_embd, eps);
    if (hidden_out) std::copy_n(scratch, n_out * n_embd, hidden_out);
    matmul(pool, op, output, scratch, n_out, logits);  // [n_out, n_vocab]
}

void WantedRows::build(const UBatch &from) {
    tokens.clear(), pos.clear(), cells.clear(), identity.clear(), seqs.clear();
    for (const int32_t r : from.output_rows) {
        tokens.push_back(from.tokens[static_cast<size_t>(r)]);
        pos.push_back(from.pos[static_cast<size_t>(r)]);
        cells.push_back(from.cells[static_cast<size_t>(r)]);
        seqs.push_back(from.seq[static_cast<size_t>(r)]);
        identity.push_back(static_cast<int32_t>(identity.size()));
    }
    ub = UBatch{tokens, pos, seqs, cells, identity, from.hidden_out, from.first_of_call};
}

void compact_rows(float *x, int64_t width, std::span<const int32_t> rows) {
    for (size_t i = 0; i < rows.size(); ++i) {
        SPARROW_ASSERT(rows[i] >= static_cast<int32_t>(i) && (i == 0 || rows[i] > rows[i - 1]));
        if (rows[i] != static_cast<int32_t>(i))
            std::copy_n(x + rows[i] * width, width, x + static_cast<int64_t>(i) * width);
    }
}

}  // namespace sparrow
