// matmul: the hot op. Weight rows are split across the pool's threads in chunks; activations are quantised
// once per call for Q8_0/Q4_0 weights (to Q8_0; for Q4_0 in BlockQ8_0x2 records with block sums, see dispatch.h);
// tokens are taken max_tile(type) at a time (8 for Q8_0, 4 for Q4_0 and float weights) so each weight row is loaded
// once per tile. The ISA-specific inner loops come from the dispatch table (kernels/cpu/); where the level has a
// multi-row kernel for the type (DotRowsFn: Q8_0), a worker's whole row range goes to it in one call per tile.
// Rows packed eight to a record (WeightMatrix::rows8) go to the table's packed-row kernel for their type
// (KernelTable::dot_rows8), in row ranges of whole groups and in tiles of 8 tokens whatever the type.
#include <algorithm>
#include <atomic>

#include "core/error.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/ops.h"

namespace sparrow {

// Everything the row workers need, behind one reference: a lambda capturing a single reference fits in
// std::function's inline storage, so handing the job to the pool does not allocate.
struct MatmulJob {
    const WeightMatrix *w = nullptr;
    cpu::DotTileFn dot = nullptr;
    cpu::DotRowsFn dot_rows = nullptr;  // the multi-row kernel where the level has one for the type, else null
    const cpu::KernelTable *kernels = nullptr;
    const float *x = nullptr;  // [n_tokens, n_cols] f32, rows x_stride floats apart
    int64_t x_stride = 0;
    const uint8_t *xd = nullptr;  // activations in the dot type: n_tokens rows, xd_stride bytes apart
    size_t xd_stride = 0;
    uint8_t *xq = nullptr;  // where quantised activations are written (scratch), or null for float weights
    int64_t n_tokens = 0;
    int tile = 1;        // tokens per kernel call (KernelTable::tile)
    float *y = nullptr;  // [n_tokens, n_rows], rows y_stride floats apart
    int64_t y_stride = 0;
    // matmul_many only: where the job's quantised activations sit in the scratch, whether this job writes them
    // (else an earlier job with the same activations does), and the rows per chunk.
    size_t xd_offset = 0;
    bool quantize = false;
    int64_t grain = 0;
};

// Rows [r0, r1) of job `job` (matmul_many).
struct MatmulChunk {
    int64_t job = 0, r0 = 0, r1 = 0;
};

OpScratch::OpScratch() = default;
OpScratch::~OpScratch() = default;
OpScratch::OpScratch(OpScratch &&) noexcept = default;
OpScratch &OpScratch::operator=(OpScratch &&) noexcept = default;

namespace {

// Rows [r0, r1) for every token. The token tiles are the outer loop: a chunk's rows stay in L2 between
// tiles, so for prefill each weight byte comes from memory once per matmul and from L2 once per tile.
void matmul_rows(const MatmulJob &job, int64_t r0, int64_t r1) {
    const WeightMatrix &w = *job.w;
    const int tile = job.tile;
    float out[cpu::kMaxQuantTile];
    for (int64_t t0 = 0; t0 < job.n_tokens; t0 += tile) {
        const int n_x = static_cast<int>(std::min<int64_t>(tile, job.n_tokens - t0));
        const uint8_t *xt = job.xd + t0 * static_cast<int64_t>(job.xd_stride);
        float *yt = job.y + t0 * job.y_stride;
        if (job.dot_rows) {
            job.dot_rows(w.row(r0), static_cast<size_t>(w.row_bytes), r1 - r0, xt, job.xd_stride, n_x, w.n_cols,
                         yt + r0, static_cast<size_t>(job.y_stride));
            continue;
        }
        for (int64_t r = r0; r < r1; ++r) {
            job.dot(w.row(r), xt, job.xd_stride, n_x, w.n_cols, out);
            for (int j = 0; j < n_x; ++j) yt[j * job.y_stride + r] = out[j];
        }
    }
}

// Weight bytes per chunk. Decode streams each row once: long contiguous chunks keep the hardware prefetchers
// running (256 KiB measured ~5-8% faster than 32 KiB on the 2-core EPYC, DRAM-sized matrices). Prefill revisits
// a chunk once per token tile, so it should stay in L2 alongside the activations (~128 KiB).
int64_t chunk_bytes(const MatmulJob &job) {
    return job.n_tokens <= job.tile ? (int64_t(256) << 10) : (int64_t(128) << 10);
}

// A chunk length in rows made whole pairs of groups of packed rows (rows8), at least one pair: the VNNI kernel
// takes sixteen rows at a time, and a chunk of 8 mod 16 rows would leave it a last group of eight in every
// chunk (run with half the register's lanes masked off). Other levels take groups of eight, which sixteen also
// are.
int64_t whole_groups(const WeightMatrix &w, int64_t rows) {
    if (!w.rows8) return std::max<int64_t>(1, rows);
    return std::max<int64_t>(16, (rows + 15) / 16 * 16);
}

// Rows per chunk that parallel_for hands out.
int64_t matmul_grain(const MatmulJob &job, int n_threads) {
    const WeightMatrix &w = *job.w;
    const int64_t by_size = std::max<int64_t>(1, chunk_bytes(job) / w.row_bytes);
    // At least ~4 chunks per thread, so threads that run ahead (or share a core) even out.
    const int64_t by_balance = (w.n_rows + 4 * n_threads - 1) / (4 * n_threads);
    return whole_groups(w, std::min(by_size, by_balance));
}

void check_weights(const WeightMatrix &w) {
    if (!dtype_is_supported(w.type)) {
        throw_error("matmul: weight type %s is not supported", std::string(dtype_name(w.type)).c_str());
    }
    const int64_t block = dtype_info(w.type).block_size;
    if (w.n_rows < 0 || w.n_cols <= 0 || w.n_cols % block != 0) {
        throw_error("matmul: bad %s weight shape [%lld, %lld]", std::string(dtype_name(w.type)).c_str(),
                    (long long)w.n_rows, (long long)w.n_cols);
    }
    if (w.row_bytes != dtype_row_size(w.type, w.n_cols)) {
        throw_error("matmul: row_bytes %lld does not match %lld %s elements", (long long)w.row_bytes,
                    (long long)w.n_cols, std::string(dtype_name(w.type)).c_str());
    }
    if (w.n_rows > 0 && !w.data) throw_error("matmul: weight data is null");
    if (w.rows8 && (!packs_rows8(w.type) || w.n_rows % 8 != 0)) {
        throw_error("matmul: packed rows need q8_0, q4_0 or K-quant weights in groups of 8 rows, got %s with %lld rows",
                    std::string(dtype_name(w.type)).c_str(), (long long)w.n_rows);
    }
}

// Tiny products (small models, decode) cost less than waking the pool: run them on this thread.
constexpr int64_t kMinParallelWork = int64_t(256) << 10;  // weight bytes x tokens

// The job of one product, checked, with its kernels; float weights read x in place, quantised ones get their
// activation stride (the caller places the quantised rows).
// Strides are in floats, 0 for packed rows.
MatmulJob make_job(const cpu::KernelTable &k, const WeightMatrix &w, const float *x, int64_t n_tokens, float *y,
                   int64_t x_stride = 0, int64_t y_stride = 0) {
    check_weights(w);
    if (n_tokens < 0) throw_error("matmul: n_tokens = %lld", (long long)n_tokens);
    if (x_stride < 0 || (x_stride > 0 && x_stride < w.n_cols) || y_stride < 0 ||
        (y_stride > 0 && y_stride < w.n_rows)) {
        throw_error("matmul: strides %lld and %lld are shorter than a row of [%lld, %lld] weights", (long long)x_stride,
                    (long long)y_stride, (long long)w.n_rows, (long long)w.n_cols);
    }
    MatmulJob job;
    job.w = &w;
    job.dot = k.dot(w.type);
    job.dot_rows = w.rows8 ? k.dot_rows8(w.type) : k.dot_rows(w.type);
    job.kernels = &k;
    job.tile = k.tile(w.type, w.rows8, n_tokens);
    job.x = x;
    job.x_stride = x_stride > 0 ? x_stride : w.n_cols;
    job.n_tokens = n_tokens;
    job.y = y;
    job.y_stride = y_stride > 0 ? y_stride : w.n_rows;
    if (dtype_is_quantized(w.type)) {
        job.xd_stride = static_cast<size_t>(cpu::KernelTable::dot_x_row_bytes(w.type, w.n_cols));
    } else {
        job.xd = reinterpret_cast<const uint8_t *>(x);
        job.xd_stride = static_cast<size_t>(job.x_stride) * sizeof(float);
    }
    return job;
}

// Quantises tokens [t0, t1) of the job's activations into job.xq.
void quantize_tokens(const MatmulJob &job, int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
        job.kernels->quantize_dot_x(job.w->type, job.x + t * job.x_stride,
                                    job.xq + t * static_cast<int64_t>(job.xd_stride), job.w->n_cols);
    }
}

}  // namespace

void matmul(ThreadPool &pool, OpScratch &scratch, const WeightMatrix &w, const float *x, int64_t n_tokens, float *y) {
    MatmulJob job = make_job(cpu::kernels(), w, x, n_tokens, y);
    if (n_tokens == 0 || w.n_rows == 0) return;
    if (dtype_is_quantized(w.type)) {
        // Q8_0/Q4_0 weights dot with Q8_0 activations (Q4_0: BlockQ8_0x2 records): quantise every token once, into
        // the scratch (which only grows, so a warm context does not allocate here).
        const size_t bytes = job.xd_stride * static_cast<size_t>(n_tokens);
        if (scratch.quantized_x.size() < bytes) scratch.quantized_x.resize(bytes);
        job.xq = scratch.quantized_x.data();
        job.xd = job.xq;
        // Quantising is ~1/n_rows of the matmul's work: split it only when there are many tokens.
        pool.parallel_for(n_tokens, 16, [&job](int64_t t0, int64_t t1) { quantize_tokens(job, t0, t1); });
    }

    const int64_t grain =
        w.n_rows * w.row_bytes * n_tokens < kMinParallelWork ? w.n_rows : matmul_grain(job, pool.n_threads());
    pool.parallel_for(w.n_rows, grain, [&job](int64_t r0, int64_t r1) { matmul_rows(job, r0, r1); });
}

namespace {

// matmul_many's preparation: the jobs of the tasks (checked), their activations quantised (on the pool when
// `pool` is given, else on this thread) and the row chunks cut, all in the scratch. Returns the number of chunks;
// `parallel` is whether the products are worth splitting between n_threads threads.
int64_t prepare_many(ThreadPool *pool, int n_threads, OpScratch &scratch, const MatmulTask *tasks, int64_t n_tasks,
                     bool &parallel) {
    const cpu::KernelTable &k = cpu::kernels();
    std::vector<MatmulJob> &jobs = scratch.jobs;
    jobs.clear();
    scratch.chunks.clear();
    // Activations: each quantised job gets a region of the scratch (at xd_offset), unless it repeats an
    // earlier job's activations (same x, tokens, type and width: a MoE expert's gate and up), which it reads.
    size_t bytes = 0;
    int64_t work = 0;  // weight bytes x tokens
    for (int64_t i = 0; i < n_tasks; ++i) {
        const MatmulTask &t = tasks[i];
        MatmulJob job = make_job(k, *t.w, t.x, t.n_tokens, t.y, t.x_stride, t.y_stride);
        if (t.n_tokens == 0 || t.w->n_rows == 0) continue;
        if (dtype_is_quantized(t.w->type)) {
            job.quantize = true;
            for (const MatmulJob &o : jobs) {
                if (o.quantize && o.x == t.x && o.x_stride == job.x_stride && o.n_tokens == t.n_tokens &&
                    o.w->type == t.w->type && o.w->n_cols == t.w->n_cols) {
                    job.xd_offset = o.xd_offset;
                    job.quantize = false;
                    break;
                }
            }
            if (job.quantize) {
                job.xd_offset = bytes;
                bytes += job.xd_stride * static_cast<size_t>(t.n_tokens);
            }
        }
        work += t.w->n_rows * t.w->row_bytes * t.n_tokens;
        jobs.push_back(job);
    }
    parallel = n_threads > 1 && work >= kMinParallelWork;
    if (jobs.empty()) return 0;
    if (scratch.quantized_x.size() < bytes) scratch.quantized_x.resize(bytes);
    bool any_quantize = false;
    for (MatmulJob &job : jobs) {
        if (!dtype_is_quantized(job.w->type)) continue;
        job.xd = scratch.quantized_x.data() + job.xd_offset;
        if (job.quantize) job.xq = scratch.quantized_x.data() + job.xd_offset;
        any_quantize = any_quantize || job.quantize;
    }
    if (any_quantize) {
        // Every (job, token) row that needs it, in one section.
        auto quantize = [&jobs](int64_t j0, int64_t j1) {
            for (int64_t j = j0; j < j1; ++j) {
                const MatmulJob &job = jobs[static_cast<size_t>(j)];
                if (job.quantize) quantize_tokens(job, 0, job.n_tokens);
            }
        };
        const auto n_jobs = static_cast<int64_t>(jobs.size());
        if (pool) {
            pool->parallel_for(n_jobs, parallel ? 4 : n_jobs, quantize);
        } else {
            quantize(0, n_jobs);
        }
    }
    // Row chunks, job after job: each chunk streams contiguous rows (the hardware prefetchers follow), and the
    // dynamic hand-out lets one thread stream a memory-bound job while the other computes. Chunks are as long
    // as matmul's (about 256 KiB of weights at few tokens), shortened only when the whole set would give fewer
    // than 4 chunks per thread.
    std::vector<MatmulChunk> &chunks = scratch.chunks;
    int64_t total_bytes = 0, n_by_size = 0;
    for (MatmulJob &job : jobs) {
        job.grain = parallel ? whole_groups(*job.w, chunk_bytes(job) / job.w->row_bytes) : job.w->n_rows;
        n_by_size += (job.w->n_rows + job.grain - 1) / job.grain;
        total_bytes += job.w->n_rows * job.w->row_bytes;
    }
    if (parallel && n_by_size < 4 * n_threads) {
        for (MatmulJob &job : jobs) {
            const int64_t bytes_j = job.w->n_rows * job.w->row_bytes;
            const int64_t pieces = std::max<int64_t>(1, (4 * n_threads * bytes_j + total_bytes - 1) / total_bytes);
            job.grain = whole_groups(*job.w, (job.w->n_rows + pieces - 1) / pieces);
        }
    }
    for (size_t j = 0; j < jobs.size(); ++j) {
        for (int64_t r0 = 0; r0 < jobs[j].w->n_rows; r0 += jobs[j].grain)
            chunks.push_back({static_cast<int64_t>(j), r0, std::min(jobs[j].w->n_rows, r0 + jobs[j].grain)});
    }
    return static_cast<int64_t>(chunks.size());
}

void run_chunks(const OpScratch &scratch, int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
        const MatmulChunk &ch = scratch.chunks[static_cast<size_t>(c)];
        matmul_rows(scratch.jobs[static_cast<size_t>(ch.job)], ch.r0, ch.r1);
    }
}

}  // namespace

void matmul_many(ThreadPool &pool, OpScratch &scratch, const MatmulTask *tasks, int64_t n_tasks) {
    bool parallel = false;
    const int64_t n_chunks = prepare_many(&pool, pool.n_threads(), scratch, tasks, n_tasks, parallel);
    if (n_chunks == 0) return;
    pool.parallel_for(n_chunks, parallel ? 1 : n_chunks,
                      [&scratch](int64_t c0, int64_t c1) { run_chunks(scratch, c0, c1); });
}

void MatmulSection::prepare(OpScratch &scratch, const MatmulTask *tasks, int64_t n_tasks, int n_threads) {
    bool parallel = false;
    scratch_ = &scratch;
    n_chunks_ = prepare_many(nullptr, n_threads, scratch, tasks, n_tasks, parallel);
    next_.store(0, std::memory_order_relaxed);
}

void MatmulSection::run_some() {
    for (int64_t c; (c = next_.fetch_add(1, std::memory_order_relaxed)) < n_chunks_;) run_chunks(*scratch_, c, c + 1);
}

void MatmulSection::finish(ThreadPool &pool) {
    // Chunks nobody took yet; those taken are complete once run_some's callers have returned.
    const int64_t first = std::min(next_.exchange(n_chunks_, std::memory_order_relaxed), n_chunks_);
    const int64_t left = n_chunks_ - first;
    if (left > 0) {
        pool.parallel_for(left, left > 1 ? 1 : left,
                          [this, first](int64_t c0, int64_t c1) { run_chunks(*scratch_, first + c0, first + c1); });
    }
    n_chunks_ = 0;
}

}  // namespace sparrow
