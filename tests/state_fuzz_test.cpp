// Sequence state files (Context::state_seq_load) with hostile content behind a valid checksum.
//
// serving_test.cpp refuses a missing, empty, truncated or flipped file and files from another model or cache
// layout; a random flip there is caught by the checksum. Here the test knows the format (context.cpp), damages
// one field or region at a time and then writes the checksum the damaged bytes need, so the loader's own
// checks are what stand between the file and the cache: header bytes, the version, the cell count, cell
// positions (negative, repeated, decreasing, near 2^31), the rows' bytes (random, NaN scales), the token count
// and ids saved with the rows, the file cut or extended; and a version 1 file (no tokens), which loads. A load must
// either succeed, after which the sequence decodes a token (an Error is allowed there, never a crash), or throw
// sparrow::Error with code state_file or context_full and leave the cache byte-identical (digest). Both outcomes must
// occur.
//
// SPARROW_FUZZ_ITERATIONS (per model, default 300) and SPARROW_FUZZ_SEED make longer runs by hand.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/synthetic.h"
#include "sparrow/sparrow.h"
#include "test_util.h"

namespace sparrow {
namespace {

using test::env_or;

uint64_t fnv1a(const std::string &bytes) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char c : bytes) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    return h;
}

// The file's bytes with their last 8 replaced by the checksum of everything before them.
std::string with_checksum(std::string body) {
    const uint64_t sum = fnv1a(body);
    body.append(reinterpret_cast<const char *>(&sum), sizeof sum);
    return body;
}

// Offsets into a state file (little-endian, version 2; context.cpp has the layout).
struct Layout {
    size_t version_at = 8;
    size_t n_cells_at = 0;  // u32
    size_t cells_at = 0;    // first cell: i32 pos, then the rows
    size_t cell_bytes = 0;  // pos + rows
    uint32_t n_cells = 0;
    size_t tokens_at = 0;  // u32 count, then the i32 ids
};

Layout parse(const std::string &b) {
    Layout l;
    size_t at = 12;  // magic, version
    auto u32 = [&] {
        uint32_t v;
        std::memcpy(&v, b.data() + at, 4);
        at += 4;
        return v;
    };
    auto i64 = [&] {
        int64_t v;
        std::memcpy(&v, b.data() + at, 8);
        at += 8;
        return v;
    };
    at += u32();  // arch
    at += 3 * 8;  // n_layer, n_embd, n_vocab
    const uint32_t n_stores = u32();
    l.cell_bytes = 4;
    for (uint32_t s = 0; s < n_stores; ++s) {
        at += u32();  // name
        u32();        // dtype
        i64();        // width
        const int64_t row_bytes = i64();
        const int64_t has_rows = i64();
        i64();  // rotated
        if (has_rows) l.cell_bytes += static_cast<size_t>(row_bytes);
    }
    l.n_cells_at = at;
    l.n_cells = u32();
    l.cells_at = at;
    l.tokens_at = at + l.n_cells * l.cell_bytes;
    return l;
}

struct Variant {
    const char *name;
    const char *arch;
    CacheType cache;
};

class StateFuzz : public ::testing::TestWithParam<Variant> {};

TEST_P(StateFuzz, DamagedFilesWithValidChecksumsLoadOrAreRefusedCleanly) {
    const Variant v = GetParam();
    const std::string dir = test::make_temp_dir("state_fuzz");
    SyntheticParams sp = synthetic_defaults(v.arch);
    sp.n_layer = 2;
    if (v.cache == CacheType::q8_0) {  // rows a multiple of the 32-element block wide
        sp.kv_lora_rank = 64;
        sp.n_rot = 32;
        sp.idx_head_dim = 64;
    }
    write_synthetic_model(sp, dir + "/m.gguf");
    const auto model = load_model(dir + "/m.gguf");
    const auto n_vocab = static_cast<int32_t>(model_info(*model).n_vocab);
    ContextParams cp;
    cp.n_ctx = 64;
    cp.n_threads = 1;
    cp.cache_type_k = cp.cache_type_v = cp.indexer_cache_type = v.cache;
    cp.dsa_top_k = 8;

    std::mt19937 rng(static_cast<uint32_t>(env_or("SPARROW_FUZZ_SEED", 11)));
    auto decode_seq = [&](Context &ctx, int32_t seq, int32_t n) {
        std::vector<BatchToken> batch;
        std::vector<int32_t> ids;
        for (int32_t i = 0; i < n; ++i) {
            ids.push_back(static_cast<int32_t>(rng() % n_vocab));
            batch.push_back({ids.back(), i, seq, i == n - 1});
        }
        ctx.decode(batch);
        return ids;
    };
    std::string good;
    {
        Context ctx(model, cp);
        ctx.state_seq_save(0, dir + "/good.state", decode_seq(ctx, 0, 20));
        std::ostringstream ss;
        ss << std::ifstream(dir + "/good.state", std::ios::binary).rdbuf();
        good = ss.str();
    }
    const Layout lay = parse(good);
    ASSERT_EQ(lay.n_cells, 20u);
    ASSERT_EQ(good.size(), lay.tokens_at + 4 + 4 * 20 + 8);
    const std::string body = good.substr(0, good.size() - 8);

    const int iterations = static_cast<int>(env_or("SPARROW_FUZZ_ITERATIONS", 300));
    int loaded = 0, refused = 0;
    for (int it = 0; it < iterations; ++it) {
        std::string b = body;
        const int kind = static_cast<int>(rng() % 9);
        auto put32 = [&](size_t at, uint32_t x) { std::memcpy(&b[at], &x, 4); };
        const auto pick = [&](std::initializer_list<int64_t> values) {
            return *(values.begin() + rng() % values.size());
        };
        if (kind == 0) {  // a header byte (arch, sizes, store names, types, widths, flags)
            b[8 + rng() % (lay.cells_at - 8)] = static_cast<char>(rng());
        } else if (kind == 1) {  // the version or the cell count
            const bool version = rng() % 4 == 0;
            put32(version ? lay.version_at : lay.n_cells_at,
                  static_cast<uint32_t>(pick({0, 1, 2, 19, 21, 64, 65, 1 << 20, 0xffffffffll})));
        } else if (kind == 2) {  // a cell's position
            const size_t cell = rng() % lay.n_cells;
            put32(lay.cells_at + cell * lay.cell_bytes,
                  static_cast<uint32_t>(static_cast<int32_t>(
                      pick({-1, 0, int64_t(cell), int64_t(cell) + 1, int64_t(cell) + 40,
                            std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::max() - 1,
                            std::numeric_limits<int32_t>::min(), static_cast<int32_t>(rng())}))));
        } else if (kind == 3) {  // rows' bytes: random, or all 0xff (NaN in f16 / f32 / a Q8_0 scale)
            const size_t at = lay.cells_at + (rng() % lay.n_cells) * lay.cell_bytes + 4;
            const size_t n = 1 + rng() % (lay.cell_bytes - 4);
            const bool nan = rng() % 2 == 0;
            for (size_t i = 0; i < n; ++i) b[at + i] = nan ? '\xff' : static_cast<char>(rng());
        } else if (kind == 4) {  // cut anywhere after the magic
            b.resize(8 + rng() % (b.size() - 8));
        } else if (kind == 5) {  // extended by junk
            b.append(1 + rng() % 100, static_cast<char>(rng()));
        } else if (kind == 6) {  // the last positions moved past the first ones (decreasing), or made equal
            const size_t cell = 1 + rng() % (lay.n_cells - 1);
            put32(lay.cells_at + cell * lay.cell_bytes, static_cast<uint32_t>(rng() % cell));
        } else if (kind == 7) {  // the token count, or one token id
            if (rng() % 2 == 0) {
                put32(lay.tokens_at, static_cast<uint32_t>(pick({0, 1, 19, 21, 0xffffffffll})));
            } else {
                put32(lay.tokens_at + 4 + 4 * (rng() % 20),
                      static_cast<uint32_t>(static_cast<int32_t>(
                          pick({-1, 0, n_vocab - 1, n_vocab, std::numeric_limits<int32_t>::max()}))));
            }
        } else {  // a version 1 file: no tokens
            b.resize(lay.tokens_at);
            put32(lay.version_at, 1);
        }
        const std::string file = dir + "/fuzzed.state";
        {
            std::ofstream out(file, std::ios::binary);
            const std::string full = with_checksum(b);
            out.write(full.data(), static_cast<std::streamsize>(full.size()));
        }
        Context ctx(model, cp);
        decode_seq(ctx, 0, 10);
        const uint64_t digest = ctx.cache_digest();
        try {
            const std::vector<int32_t> tokens = ctx.state_seq_load(1, file);
            EXPECT_LE(tokens.size(), 20u) << "kind " << kind;
            for (const int32_t t : tokens) EXPECT_TRUE(t >= 0 && t < n_vocab) << "kind " << kind;
            if (kind == 8) {
                EXPECT_TRUE(tokens.empty());
            }
        } catch (const Error &e) {
            ++refused;
            EXPECT_TRUE(e.code() == ErrorCode::state_file || e.code() == ErrorCode::context_full)
                << "kind " << kind << ": " << e.what();
            EXPECT_EQ(ctx.cache_digest(), digest) << "kind " << kind << ": a refused load changed the cache";
            continue;
        }
        ++loaded;
        const int32_t last = ctx.seq_pos_max(1);
        ASSERT_GE(last, 0) << "kind " << kind;
        if (last == std::numeric_limits<int32_t>::max()) continue;  // no position after it
        try {
            const std::vector<BatchToken> next = {{static_cast<int32_t>(rng() % n_vocab), last + 1, 1, true}};
            ctx.decode(next);
        } catch (const Error &e) {
            ADD_FAILURE() << "kind " << kind << ": decoding after a load that succeeded: " << e.what();
        }
    }
    EXPECT_GE(loaded, iterations / 10) << "too few damaged files loaded to test anything past the checks";
    EXPECT_GE(refused, iterations / 2);
    std::printf("%s: %d damaged state files loaded, %d refused\n", v.name, loaded, refused);
    std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Archs, StateFuzz,
                         ::testing::Values(Variant{"llama", "llama", CacheType::f32},
                                           Variant{"deepseek32", "deepseek32", CacheType::f16},
                                           Variant{"deepseek32_q8_0", "deepseek32", CacheType::q8_0}),
                         [](const auto &p) { return std::string(p.param.name); });

}  // namespace
}  // namespace sparrow
