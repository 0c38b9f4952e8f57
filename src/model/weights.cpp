#include "model/weights.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "core/error.h"
#include "core/mapped_file.h"

namespace sparrow {

namespace {

// pack_rows8 over up to hardware_concurrency threads, in chunks of whole groups of about 8 MiB handed
// out in turn: packing reads the file's pages in (from disk the first time) and writes fresh anonymous pages,
// and a big model has GBs of it. With release, each chunk's source pages are dropped once it is packed, so
// the peak holds the packed matrix and a few chunks of the file rather than both copies of it: a real
// model's expert stack is GBs. (On the bench model, whose largest matrix is 70 MB, the peak of a 16K
// prefill measured the same either way: 1106 MiB.)
void pack_in_parallel(DType type, const void *src, int64_t n_rows, int64_t n_cols, uint8_t *dst, bool release) {
    const int64_t row_bytes = dtype_row_size(type, n_cols);
    const int64_t n_groups = n_rows / 8, group_bytes = 8 * row_bytes;
    const int64_t chunk = std::max<int64_t>(1, (int64_t(8) << 20) / group_bytes);
    const int64_t n_chunks = (n_groups + chunk - 1) / chunk;
    const int64_t n_threads = std::clamp<int64_t>(n_chunks, 1, std::max(1u, std::thread::hardware_concurrency()));
    std::atomic<int64_t> next{0};
    auto work = [&] {
        for (int64_t c; (c = next.fetch_add(1)) < n_chunks;) {
            const int64_t g0 = c * chunk, g1 = std::min(n_groups, g0 + chunk);
            const uint8_t *from = static_cast<const uint8_t *>(src) + g0 * group_bytes;
            pack_rows8(type, from, (g1 - g0) * 8, n_cols, dst + g0 * group_bytes);
            if (release) release_mapped_pages(from, static_cast<size_t>((g1 - g0) * group_bytes));
        }
    };
    std::vector<std::jthread> threads;  // joined on the way out, also when starting one of them throws
    for (int64_t i = 1; i < n_threads; ++i) threads.emplace_back(work);
    work();
}

std::string shape_string(const std::vector<int64_t> &ne) {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}
}  // namespace

const gguf::TensorInfo &WeightLoader::take(const std::string &name, const std::vector<int64_t> &ne) {
    const gguf::TensorInfo *t = file_.find_tensor(name);
    if (!t) throw_error("%s: tensor '%s' is missing", file_.name().c_str(), name.c_str());
    if (t->ne != ne) {
        throw_error("%s: tensor '%s' has shape %s, expected %s", file_.name().c_str(), name.c_str(),
                    t->shape_string().c_str(), shape_string(ne).c_str());
    }
    if (!dtype_is_supported(t->type)) {
        throw_error(
            "%s: tensor '%s' has type %s, which sparrow cannot compute with (supported: f32, f16, bf16, "
            "q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs)",
            file_.name().c_str(), name.c_str(), std::string(dtype_name(t->type)).c_str());
    }
    if (used_.insert(name).second) {
        n_params_ += t->n_elements;
        n_bytes_ += t->n_bytes;
    }
    return *t;
}

WeightMatrix WeightLoader::weight_matrix(const gguf::TensorInfo &t, int64_t n_cols, int64_t rows_per_mat,
                                         int64_t n_mats) {
    note_matrix_type(t.type);
    WeightMatrix m{t.type, t.data, rows_per_mat * n_mats, n_cols, dtype_row_size(t.type, n_cols)};
    // Packed groups must not straddle two matrices of a stack (slices are whole matrices), hence rows_per_mat.
    if (!repack_ || !packs_rows8(t.type) || rows_per_mat % 8 != 0 || m.n_rows == 0) return m;
    if (const auto it = by_name_.find(t.name); it != by_name_.end()) return it->second;
    if (packed_.capacity() == 0) {
        size_t packable = 0;  // an upper bound of what this model packs: every tensor of a type it could
        for (const gguf::TensorInfo &each : file_.tensors()) {
            if (packs_rows8(each.type)) packable += static_cast<size_t>(each.n_bytes) + PageArena::kAlignment;
        }
        packed_ = PageArena(packable);
    }
    // Not zeroed: every byte is written by the packing in pack() (fresh pages of the arena are zero anyway).
    uint8_t *bytes = packed_.allocate(static_cast<size_t>(m.n_rows * m.row_bytes));
    pending_.push_back({t.type, t.data, m.n_rows, n_cols, bytes});
    m.data = bytes;
    m.rows8 = true;
    by_name_.emplace(t.name, m);
    n_repacked_bytes_ += m.n_rows * m.row_bytes;
    return m;
}

WeightMatrix WeightLoader::matrix(const std::string &name, int64_t n_cols, int64_t n_rows) {
    return weight_matrix(take(name, {n_cols, n_rows}), n_cols, n_rows, 1);
}

WeightMatrix WeightLoader::matrix_stack(const std::string &name, int64_t n_cols, int64_t n_rows, int64_t n_mats) {
    return weight_matrix(take(name, {n_cols, n_rows, n_mats}), n_cols, n_rows, n_mats);
}

WeightMatrix WeightLoader::matrix_stack_parts(const std::string &name, int64_t n_cols, int64_t n_rows, int64_t n_parts,
                                              int64_t n_mats) {
    // Packing keeps each part's rows in groups of their own (rows_per_mat = n_rows), so a part is a whole slice.
    return weight_matrix(take(name, {n_cols, n_parts * n_rows, n_mats}), n_cols, n_rows, n_parts * n_mats);
}

const float *WeightLoader::vector(const std::string &name, int64_t n) {
    const gguf::TensorInfo &t = take(name, {n});
    if (t.type == DType::F32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0) {
        return reinterpret_cast<const float *>(t.data);
    }
    auto &copy = converted_.emplace_back(static_cast<size_t>(n));
    dequantize_row(t.type, t.data, copy.data(), n);
    return copy.data();
}

void WeightLoader::note_matrix_type(DType type) {
    const std::string name(dtype_name(type));
    if (std::find(matrix_types_.begin(), matrix_types_.end(), name) == matrix_types_.end()) {
        matrix_types_.push_back(name);
    }
}

std::string WeightLoader::matrix_types() const {
    std::string s;
    for (const auto &t : matrix_types_) s += (s.empty() ? "" : ", ") + t;
    return s;
}

void WeightLoader::pack() {
    // Only a mapping's pages are released: dropping those of a caller's buffer (File::parse) would zero them.
    for (const PendingPack &p : pending_) pack_in_parallel(p.type, p.src, p.n_rows, p.n_cols, p.dst, file_.mapped());
    pending_.clear();
}

std::vector<std::string> WeightLoader::unused_tensors() const {
    std::vector<std::string> out;
    for (const auto &t : file_.tensors()) {
        if (!used_.count(t.name)) out.push_back(t.name);
    }
    return out;
}

}  // namespace sparrow
