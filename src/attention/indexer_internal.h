// lightning_indexer_select with an explicit kernel level, so tests can run every level the CPU has (the
// public function uses the active level of kernels/cpu/dispatch.h, which SPARROW_ISA can lower).
#pragma once

#include "attention/lightning_indexer.h"
#include "kernels/cpu/dispatch.h"

namespace sparrow::indexer {

// As lightning_indexer_select; `isa` must be a level the CPU has (cpu::cpu_supports). avx512 runs the AVX-512
// exact kernel and, where the CPU has VNNI, the VNNI int8 kernels (else the AVX2 ones).
void select_with_isa(cpu::Isa isa, ThreadPool &pool, const IndexerShape &shape, IndexerPrecision precision,
                     const float *q, const float *w, int64_t n_tokens, const RowStore &keys,
                     std::span<const std::span<const int32_t>> candidates, int64_t top_k,
                     std::vector<std::vector<int32_t>> &selected, IndexerWorkspace *workspace = nullptr,
                     const std::function<void()> &beside_merge = {});

// As select_with_isa at the avx2 level with the plain AVX2 int8 kernels (maddubs, 6-bit queries) even where the CPU
// has AVX-VNNI, so that tests cover that path on any AVX2 CPU.
void select_with_avx2_maddubs(ThreadPool &pool, const IndexerShape &shape, IndexerPrecision precision, const float *q,
                              const float *w, int64_t n_tokens, const RowStore &keys,
                              std::span<const std::span<const int32_t>> candidates, int64_t top_k,
                              std::vector<std::vector<int32_t>> &selected);

// The offset of fast mode's query bytes at a level (indexer_kernels.h): kQueryOffsetDpbusd (8-bit queries) for
// scalar and VNNI kernels (AVX-VNNI at avx2, AVX512-VNNI at avx512), kQueryOffsetMaddubs (6-bit) for plain AVX2.
int query_offset_for(cpu::Isa isa);

}  // namespace sparrow::indexer
