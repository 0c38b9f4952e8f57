// CPU ops with their shape contracts. All matrices are row-major; "[a, b]" means a rows of b contiguous
// elements. Every op here has a scalar reference in kernels/ref/ (ref_ops.h) that tests compare against;
// the optimised versions dispatch at run time to the best ISA the CPU has (kernels/cpu/dispatch.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace sparrow {

// A weight matrix [n_rows, n_cols] stored in GGUF layout: row r holds the n_cols inputs that produce
// output r (ggml's ne[0] = n_cols, ne[1] = n_rows). Memory-mapped from the model file or, packed, owned by
// the model's loader; never owned by the matrix.
//
// rows8 (Q8_0, Q4_0, Q2_K ... Q6_K; n_rows % 8 == 0): the rows are packed eight to a record (core/blocks.h
// BlockQ8_0x8, BlockQ4_0x8, BlockQ4_Kx8, BlockQ5_Kx8, BlockQ6_Kx8; pack_rows8). The bytes are as many as unpacked, so
// row(r) for r % 8 == 0 is where the group of rows r..r+7 starts (slices of whole groups work as for unpacked rows);
// other rows have no address of their own.
struct WeightMatrix {
    DType type = DType::F32;
    const void *data = nullptr;
    int64_t n_rows = 0;     // outputs
    int64_t n_cols = 0;     // inputs; a multiple of the type's block size
    int64_t row_bytes = 0;  // dtype_row_size(type, n_cols)
    bool rows8 = false;

    const uint8_t *row(int64_t r) const { return static_cast<const uint8_t *>(data) + r * row_bytes; }
};

// Q8_0, Q4_0 or K-quant rows [n_rows, n_cols] (n_rows % 8 == 0, n_cols a multiple of the type's block)
// packed eight to a record into dst (as many bytes as src), and back: unpack_row8 writes row r of a packed matrix as
// its blocks, the bytes the file held (dtype_row_size(t, n_cols) of them).
bool packs_rows8(DType t);  // Q8_0, Q4_0, MXFP4, a K-quant (Q2_K ... Q6_K) or IQ4_XS
void pack_rows8(DType t, const void *src, int64_t n_rows, int64_t n_cols, void *dst);
void unpack_row8(DType t, const void *packed, int64_t r, int64_t n_cols, void *out);

// Scratch owned by whoever runs the ops (a model context): sized on first use, then reused, so the hot
// path does not allocate once warmed up.
struct MatmulJob;
struct MatmulChunk;
struct OpScratch {
    std::vector<uint8_t> quantized_x;  // activations quantised to the weight type's dot type
    std::vector<MatmulJob> jobs;       // matmul_many: one per task
    std::vector<MatmulChunk> chunks;   // matmul_many: the row chunks of every task, as dealt to the threads
    OpScratch();
    ~OpScratch();
    OpScratch(OpScratch &&) noexcept;
    OpScratch &operator=(OpScratch &&) noexcept;
};

// y[t, r] = sum_c w[r, c] * x[t, c]
//   w: [n_rows, n_cols] of any supported type
//   x: [n_tokens, n_cols] f32;  y: [n_tokens, n_rows] f32 (must not alias x)
// Q8_0 and Q4_0 weights: x is first quantised to Q8_0 per token (as ggml does) and the dot product is
// integer within each 32-block. Packed rows (rows8) give the same bits on every ISA level and for any
// number of tokens (cpu::KernelTable::dot_rows_q8_0x8, dot_rows_q4_0x8). F32/F16/BF16 weights: x stays f32 and products
// accumulate in f32. Rows are split across the pool's threads; tokens are processed in tiles so that each weight row is
// read once per tile, not once per token.
void matmul(ThreadPool &pool, OpScratch &scratch, const WeightMatrix &w, const float *x, int64_t n_tokens, float *y);

// One product of matmul_many: y = matmul(w, x, n_tokens), with token t's activations at x + t * x_stride and its
// outputs at y + t * y_stride (in floats; 0: packed, w.n_cols and w.n_rows). Strides let a product read one
// head's slice of a [tokens, heads, dim] tensor and write into another without gathering copies.
struct MatmulTask {
    const WeightMatrix *w = nullptr;
    const float *x = nullptr;
    int64_t n_tokens = 0;
    float *y = nullptr;
    int64_t x_stride = 0;
    int64_t y_stride = 0;
};
// Several independent products in one parallel section, each output bit-identical to its own matmul call.
// The tasks' row chunks are handed to the threads from one list: the experts of a MoE layer (a few tokens
// each, bound by memory bandwidth) or the heads of MLA's per-head products then share one wake-up and one
// barrier instead of one per matrix, and one thread can stream a memory-bound task while another computes.
// No task's y may overlap another task's x or y. Tasks with the same x, x_stride, n_tokens, weight type and
// width quantise their activations once.
void matmul_many(ThreadPool &pool, OpScratch &scratch, const MatmulTask *tasks, int64_t n_tasks);

// matmul_many's products as work that runs beside something else in one parallel section: threads that a
// serial step would leave idle take row chunks while it runs (decode's merge of the indexer's splits and the
// MLA query's per-head products, which do not wait for the selection). prepare() checks the tasks, quantises
// their activations on the calling thread and cuts the chunks (as matmul_many would for n_threads) into
// `scratch`, which must not be used by anything else until finish(). run_some() takes chunks one at a time
// until none is left; any number of threads may call it at once. finish() runs on the pool the chunks nobody
// took; call it after every run_some() has returned. The outputs are bit-identical to matmul_many's.
class MatmulSection {
  public:
    void prepare(OpScratch &scratch, const MatmulTask *tasks, int64_t n_tasks, int n_threads);
    void run_some();
    void finish(ThreadPool &pool);

  private:
    OpScratch *scratch_ = nullptr;
    int64_t n_chunks_ = 0;
    std::atomic<int64_t> next_{0};
};

// out[t, :] = dequantised row ids[t] of table (an embedding lookup, ggml get_rows).
//   table: [n_rows, n_cols] any supported type; ids: [n] in [0, n_rows); out: [n, n_cols] f32
// Throws sparrow::Error for an id out of range.
void get_rows(const WeightMatrix &table, const int32_t *ids, int64_t n, float *out);

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w     x, y: [n_rows, n] (may alias); w: [n] or null
void rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps);

// y[r, :] = (x[r, :] - mean) / sqrt(var + eps) * w + b     w, b: [n] or null; x, y may alias
void layer_norm(const float *x, const float *w, const float *b, float *y, int64_t n_rows, int64_t n, float eps);

// Rotary position embedding, ggml's definition (including YaRN). Applied in place to x:
//   x: [n_tokens, n_heads, head_dim]; pos: [n_tokens]
// Only the first n_rot dims of each head rotate; the rest pass through. Pair i (i = 0 .. n_rot/2-1) has
//   theta_extrap = pos * freq_base^(-2i/n_rot),  theta_interp = freq_scale * theta_extrap
// and with ext_factor != 0 the YaRN ramp mixes them:
//   ramp = 1 - clamp((i - corr_low) / max(0.001, corr_high - corr_low), 0, 1)
//   theta = theta_interp * (1 - ramp*ext_factor) + theta_extrap * ramp*ext_factor
//   mscale = attn_factor * (1 + 0.1 * ln(1 / freq_scale))        (without YaRN: mscale = attn_factor)
//   corr_low  = max(0, floor(n_rot * ln(n_ctx_orig / (beta_fast * 2pi)) / (2 ln freq_base)))
//   corr_high = min(n_rot - 1, ceil(n_rot * ln(n_ctx_orig / (beta_slow * 2pi)) / (2 ln freq_base)))
// and the pair (a, b) becomes (a cos - b sin, a sin + b cos) * mscale. The pair's members are
//   RopeLayout::adjacent:   (x[2i], x[2i+1])              (ggml LLAMA_ROPE_TYPE_NORM, "interleaved")
//   RopeLayout::half_split: (x[i], x[i + n_rot/2])        (ggml LLAMA_ROPE_TYPE_NEOX)
enum class RopeLayout { adjacent, half_split };
struct RopeParams {
    RopeLayout layout = RopeLayout::adjacent;
    int n_rot = 0;
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;
    float ext_factor = 0.0f;  // 0 disables YaRN
    float attn_factor = 1.0f;
    float beta_fast = 32.0f;
    float beta_slow = 1.0f;
    int n_ctx_orig = 0;
};
void rope(float *x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t *pos, const RopeParams &p);

// RopeParams with each pair's frequency and YaRN mix computed once (a model keeps one per set of parameters):
// rope() over a table skips the pow() per pair that every call over RopeParams pays (32 pairs, one token and one
// head: 0.4 against 1.2 us a call; three calls a layer in a DeepSeek decode step). Same bits either way. Throws
// sparrow::Error for an odd or non-positive n_rot; a default-constructed table has none, and rope() refuses it.
class RopeTable {
  public:
    RopeTable() = default;
    explicit RopeTable(const RopeParams &p);
    const RopeParams &params() const { return p_; }
    float mscale() const { return mscale_; }
    const double *inv_freq() const { return inv_freq_.data(); }  // [n_rot / 2]
    const double *mix() const { return mix_.data(); }            // [n_rot / 2]

  private:
    RopeParams p_;
    float mscale_ = 1.0f;
    std::vector<double> inv_freq_, mix_;
};
void rope(float *x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, const int32_t *pos, const RopeTable &table);

// In place: x = softmax(x * scale) over n elements (max-subtracted; an all -inf row becomes all zeros).
void softmax(float *x, int64_t n, float scale = 1.0f);

// out[i] = silu(gate[i]) * up[i]; silu(v) = v / (1 + exp(-v)). out may alias gate or up.
void swiglu(const float *gate, const float *up, float *out, int64_t n);

// In place, per row: x = H x / sqrt(n), the orthonormal Walsh-Hadamard transform (Sylvester order).
//   x: [n_rows, n]; n must be a power of two.
void hadamard(float *x, int64_t n_rows, int64_t n);

// The k largest of scores[0 .. n), written to idx[0 .. min(k, n)) in descending score order. Ties break
// towards the lower index. NaN counts as smaller than everything. Returns the number written, min(k, n).
// Runs in O(n log k) with a bounded heap (no full sort).
int64_t top_k(const float *scores, int64_t n, int64_t k, int32_t *idx);

// Dot products used by attention and the indexer (one row of a cache against an f32 vector).
//   row: n elements of type t (F32, F16 or BF16); x: [n] f32
float dot_row(DType t, const void *row, const float *x, int64_t n);
// y[0..n) = row converted to f32: F32, F16, BF16 (exact) or Q8_0, Q4_0 (dequantised as dequantize_row does;
// n a multiple of 32, the row starting at a block).
void convert_row_to_f32(DType t, const void *row, float *y, int64_t n);
// y[:] += a * row[:] for a cache row of type t (F32, F16 or BF16).
void axpy_row(DType t, const void *row, float a, float *y, int64_t n);

}  // namespace sparrow
