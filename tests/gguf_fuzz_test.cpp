// A deterministic mutation fuzzer for the GGUF reader, run as an ordinary test.
//
// Seed files come from the Writer (metadata of every type, several tensors, a few alignments); each
// iteration mutates one or splices two (bit flips, interesting bytes, boundary values written over the
// integer fields of the header, truncation, insertion, deletion) and parses the result from an exactly
// sized heap allocation, so that AddressSanitizer sees any read past the end. Every result must be a
// successful parse whose invariants hold (checked again from the outside, every byte and value touched,
// written back and re-read identically) or a sparrow::Error. Anything else (a crash, another exception, a
// sanitizer report, a hang caught by the CTest timeout) is a bug.
//
// SPARROW_FUZZ_ITERATIONS and SPARROW_FUZZ_SEED override the iteration count and the random seed for
// longer runs by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "test_util.h"

namespace sparrow::gguf {
namespace {

constexpr const char *kName = "<fuzz>";

using test::env_or;

// --- seeds ------------------------------------------------------------------------------------------------

std::vector<float> ramp(size_t n) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = 0.25f * float(i) - 3.0f;
    return x;
}

void add(Writer &w, const std::string &name, DType type, std::vector<int64_t> ne) {
    int64_t rows = 1;
    for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
    const int64_t row_bytes = dtype_row_size(type, ne[0]);
    std::vector<uint8_t> data(static_cast<size_t>(row_bytes * rows));
    const std::vector<float> x = ramp(static_cast<size_t>(ne[0]));
    for (int64_t r = 0; r < rows; ++r) quantize_row(type, x.data(), data.data() + r * row_bytes, ne[0]);
    w.add_tensor(name, type, std::move(ne), data.data(), data.size());
}

std::vector<std::vector<uint8_t>> make_seeds() {
    using VT = ValueType;
    std::vector<std::vector<uint8_t>> seeds;
    {  // Every scalar type, strings, arrays, nested arrays; five tensors of every supported type.
        Writer w;
        w.set("general.architecture", Value::str("llama"));
        w.set("u8", Value::u8(200));
        w.set("i8", Value::i8(-5));
        w.set("u16", Value::u16(60000));
        w.set("i16", Value::i16(-300));
        w.set("u32", Value::u32(123456));
        w.set("i32", Value::i32(-123456));
        w.set("u64", Value::u64(uint64_t(1) << 40));
        w.set("i64", Value::i64(-(int64_t(1) << 40)));
        w.set("f32", Value::f32(0.5f));
        w.set("f64", Value::f64(-1.25));
        w.set("bool", Value::boolean(true));
        w.set("str", Value::str("h\xc3\xa9llo"));
        w.set("empty", Value::str(""));
        w.set("arr.i32", Value::array(VT::INT32, {Value::i32(1), Value::i32(-2), Value::i32(3)}));
        w.set("arr.str", Value::array(VT::STRING, {Value::str("a"), Value::str(""), Value::str("bcd")}));
        w.set("arr.bool", Value::array(VT::BOOL, {Value::boolean(false), Value::boolean(true)}));
        w.set("arr.f64", Value::array(VT::FLOAT64, {Value::f64(1.0)}));
        w.set("arr.nested",
              Value::array(VT::ARRAY, {Value::array(VT::UINT16, {Value::u16(7)}), Value::array(VT::STRING, {})}));
        w.set("arr.empty", Value::array(VT::UINT8, {}));
        add(w, "f32", DType::F32, {4, 2});
        add(w, "f16", DType::F16, {3});
        add(w, "bf16", DType::BF16, {2, 1, 2, 1});
        add(w, "q8", DType::Q8_0, {32});
        add(w, "q4", DType::Q4_0, {32, 2, 1});
        seeds.push_back(w.to_bytes());
    }
    {  // Small alignment: tensors packed tightly, where an off-by-one in an extent check shows.
        Writer w;
        w.set("general.alignment", Value::u32(4));
        w.set("arr.u8", Value::array(VT::UINT8, {Value::u8(1), Value::u8(2)}));
        w.set("deep", Value::array(VT::ARRAY, {Value::array(VT::ARRAY, {Value::array(VT::INT8, {Value::i8(1)})})}));
        add(w, "a", DType::F32, {1});
        add(w, "b", DType::F16, {2});
        add(w, "c", DType::F32, {3, 1});
        seeds.push_back(w.to_bytes());
    }
    {  // A vocabulary-like file: no tensors, string and number arrays.
        Writer w;
        w.set("tokenizer.ggml.model", Value::str("gpt2"));
        std::vector<Value> tokens, scores, types;
        for (int i = 0; i < 12; ++i) {
            tokens.push_back(Value::str(std::string(size_t(i % 4), char('a' + i))));
            scores.push_back(Value::f32(-float(i)));
            types.push_back(Value::i32(i % 3));
        }
        w.set("tokenizer.ggml.tokens", Value::array(VT::STRING, tokens));
        w.set("tokenizer.ggml.scores", Value::array(VT::FLOAT32, scores));
        w.set("tokenizer.ggml.token_type", Value::array(VT::INT32, types));
        w.set("tokenizer.ggml.bos_token_id", Value::u32(1));
        seeds.push_back(w.to_bytes());
    }
    {  // Version 2 (same layout as 3 for our purposes), alignment 64, one 4-d tensor.
        Writer w;
        w.set("general.alignment", Value::u32(64));
        w.set("general.name", Value::str("v2"));
        add(w, "t", DType::Q8_0, {64, 1, 1, 2});
        add(w, "u", DType::F32, {5});
        std::vector<uint8_t> bytes = w.to_bytes();
        bytes[4] = 2;
        seeds.push_back(std::move(bytes));
    }
    return seeds;
}

// Where the integer fields of a valid file are (counts, lengths, type ids, dimensions, offsets, values):
// overwriting exactly those with boundary values reaches the reader's checks far more often than random
// positions would.
struct Field {
    size_t pos;
    int width;
};

std::vector<Field> integer_fields(const std::vector<uint8_t> &b) {
    std::vector<Field> fields;
    size_t p = 0;
    auto read = [&](int width) {
        uint64_t v = 0;
        std::memcpy(&v, b.data() + p, static_cast<size_t>(width));
        fields.push_back({p, width});
        p += static_cast<size_t>(width);
        return v;
    };
    auto skip_string = [&] { p += read(8); };
    auto walk = [&](auto &self, uint32_t type) -> void {
        switch (static_cast<ValueType>(type)) {
            case ValueType::UINT8:
            case ValueType::INT8:
            case ValueType::BOOL: read(1); return;
            case ValueType::UINT16:
            case ValueType::INT16: read(2); return;
            case ValueType::UINT32:
            case ValueType::INT32:
            case ValueType::FLOAT32: read(4); return;
            case ValueType::UINT64:
            case ValueType::INT64:
            case ValueType::FLOAT64: read(8); return;
            case ValueType::STRING: skip_string(); return;
            case ValueType::ARRAY: {
                const auto elem = static_cast<uint32_t>(read(4));
                const uint64_t n = read(8);
                for (uint64_t i = 0; i < n; ++i) self(self, elem);
                return;
            }
        }
    };
    read(4);  // magic
    read(4);  // version
    const uint64_t n_tensors = read(8);
    const uint64_t n_kv = read(8);
    for (uint64_t i = 0; i < n_kv; ++i) {
        skip_string();
        walk(walk, static_cast<uint32_t>(read(4)));
    }
    for (uint64_t i = 0; i < n_tensors; ++i) {
        skip_string();
        const uint64_t n_dims = read(4);
        for (uint64_t d = 0; d < n_dims; ++d) read(8);
        read(4);  // type
        read(8);  // offset
    }
    return fields;
}

// --- mutations --------------------------------------------------------------------------------------------

class Mutator {
  public:
    Mutator(std::vector<std::vector<uint8_t>> seeds, uint64_t seed) : seeds_(std::move(seeds)), rng_(seed) {
        for (const auto &s : seeds_) fields_.push_back(integer_fields(s));
    }

    std::vector<uint8_t> next() {
        const size_t which = pick(seeds_.size());
        std::vector<uint8_t> b = seeds_[which];
        const int n_mutations = 1 + int(pick(3));
        for (int i = 0; i < n_mutations; ++i) mutate(b, which);
        return b;
    }

  private:
    std::vector<std::vector<uint8_t>> seeds_;
    std::vector<std::vector<Field>> fields_;
    std::mt19937_64 rng_;

    uint64_t pick(uint64_t n) { return n ? rng_() % n : 0; }

    uint64_t boundary_value(size_t file_size, size_t pos, uint64_t current) {
        static constexpr uint64_t kValues[] = {
            0,
            1,
            2,
            3,
            4,
            5,
            7,
            8,
            9,
            12,
            13,
            16,
            24,
            31,
            32,
            33,
            63,
            64,
            127,
            128,
            255,
            256,
            4096,
            0x7fff,
            0x8000,
            0xffff,
            0x10000,
            0x7fffffff,
            0x80000000,
            0xffffffff,
            uint64_t(1) << 32,
            (uint64_t(1) << 32) + 1,
            uint64_t(1) << 60,
            uint64_t(1) << 62,
            0x7fffffffffffffff,
            0x8000000000000000,
            ~uint64_t(0),
        };
        switch (pick(4)) {
            case 0: return file_size;
            case 1: return file_size - std::min(pos, file_size);
            case 2: return current + (pick(2) ? 1 : ~uint64_t(0)) * (1 + pick(4));  // +-1..4
            default: return kValues[pick(std::size(kValues))];
        }
    }

    // A position in the header (where nearly all the checks are) three times out of four.
    size_t position(const std::vector<uint8_t> &b, size_t which) {
        const auto &fields = fields_[which];
        const size_t header_end = fields.empty() ? b.size() : fields.back().pos + size_t(fields.back().width);
        if (pick(4) != 0 && header_end > 0) return size_t(pick(std::min(header_end, b.size())));
        return size_t(pick(b.size()));
    }

    void overwrite(std::vector<uint8_t> &b, size_t pos, int width, uint64_t v) {
        for (int i = 0; i < width && pos + size_t(i) < b.size(); ++i) b[pos + size_t(i)] = uint8_t(v >> (8 * i));
    }

    void mutate(std::vector<uint8_t> &b, size_t which) {
        if (b.empty()) {
            b.push_back(uint8_t(rng_()));
            return;
        }
        switch (pick(10)) {
            case 0: {  // bit flip
                const size_t p = position(b, which);
                b[p] ^= uint8_t(1u << pick(8));
                return;
            }
            case 1: {  // an interesting byte
                static constexpr uint8_t kBytes[] = {0, 0xff, 0x7f, 0x80, 1, 2, 9, 12};
                b[position(b, which)] = kBytes[pick(std::size(kBytes))];
                return;
            }
            case 2:
            case 3:
            case 4: {  // a boundary value over a known integer field (or a random spot)
                const auto &fields = fields_[which];
                Field f{position(b, which), pick(2) ? 4 : 8};
                if (!fields.empty() && pick(5) != 0) f = fields[pick(fields.size())];
                uint64_t current = 0;
                for (int i = 0; i < f.width && f.pos + size_t(i) < b.size(); ++i)
                    current |= uint64_t(b[f.pos + size_t(i)]) << (8 * i);
                overwrite(b, f.pos, f.width, boundary_value(b.size(), f.pos, current));
                return;
            }
            case 5: {  // truncation
                b.resize(size_t(pick(b.size())));
                return;
            }
            case 6: {  // insert random bytes or a copy of another part of the file
                const size_t p = position(b, which);
                const size_t n = 1 + size_t(pick(pick(2) ? 8 : 64));
                std::vector<uint8_t> chunk(n);
                if (pick(2)) {
                    for (auto &c : chunk) c = uint8_t(rng_());
                } else {
                    const size_t from = size_t(pick(b.size()));
                    for (size_t i = 0; i < n; ++i) chunk[i] = b[(from + i) % b.size()];
                }
                b.insert(b.begin() + std::ptrdiff_t(p), chunk.begin(), chunk.end());
                return;
            }
            case 7: {  // delete a range
                const size_t p = position(b, which);
                const size_t n = std::min(b.size() - p, 1 + size_t(pick(pick(2) ? 8 : 64)));
                b.erase(b.begin() + std::ptrdiff_t(p), b.begin() + std::ptrdiff_t(p + n));
                return;
            }
            case 8: {  // splice: this file's head and another seed's tail
                const auto &other = seeds_[pick(seeds_.size())];
                const size_t cut = size_t(pick(b.size() + 1));
                const size_t other_cut = size_t(pick(other.size() + 1));
                b.resize(cut);
                b.insert(b.end(), other.begin() + std::ptrdiff_t(other_cut), other.end());
                return;
            }
            default: {  // copy a range over another place in the file
                const size_t from = size_t(pick(b.size()));
                const size_t to = position(b, which);
                const size_t n = std::min({b.size() - from, b.size() - to, 1 + size_t(pick(16))});
                std::memmove(b.data() + to, b.data() + from, n);
                return;
            }
        }
    }
};

// --- invariants of a successful parse ---------------------------------------------------------------------

// Touches every part of a value and checks that its representation agrees with its type.
uint64_t walk_value(const Value &v, int depth) {
    EXPECT_LE(depth, 8);
    switch (v.type) {
        case ValueType::UINT8:
        case ValueType::UINT16:
        case ValueType::UINT32:
        case ValueType::UINT64: {
            const uint64_t u = std::get<uint64_t>(v.data);
            const uint64_t max = v.type == ValueType::UINT8    ? 0xffu
                                 : v.type == ValueType::UINT16 ? 0xffffu
                                 : v.type == ValueType::UINT32 ? 0xffffffffu
                                                               : ~uint64_t(0);
            EXPECT_LE(u, max);
            return u;
        }
        case ValueType::INT8:
        case ValueType::INT16:
        case ValueType::INT32:
        case ValueType::INT64: return uint64_t(std::get<int64_t>(v.data));
        case ValueType::FLOAT32:
        case ValueType::FLOAT64: {
            const double d = std::get<double>(v.data);
            uint64_t bits;
            std::memcpy(&bits, &d, sizeof(bits));
            return bits;
        }
        case ValueType::BOOL: return std::get<bool>(v.data) ? 1 : 0;
        case ValueType::STRING: {
            uint64_t h = 0;
            for (char c : std::get<std::string>(v.data)) h = h * 31 + uint8_t(c);
            return h;
        }
        case ValueType::ARRAY: {
            const Array &a = std::get<Array>(v.data);
            uint64_t h = a.items.size();
            for (const Value &item : a.items) {
                EXPECT_EQ(item.type, a.type);
                h = h * 31 + walk_value(item, depth + 1);
            }
            return h;
        }
    }
    ADD_FAILURE() << "value of unknown type " << uint32_t(v.type);
    return 0;
}

// A fingerprint of everything the parse produced but the layout; equal fingerprints before and after a
// write-back mean the writer and reader agree.
uint64_t check_parsed(const File &f, std::span<const uint8_t> bytes) {
    EXPECT_TRUE(f.version() == 2 || f.version() == 3);
    EXPECT_TRUE(is_valid_alignment(f.alignment()));
    EXPECT_EQ(f.data_offset() % f.alignment(), 0u);
    EXPECT_EQ(f.size_bytes(), bytes.size());
    uint64_t h = 0;
    for (const auto &[key, value] : f.metadata()) {
        EXPECT_EQ(f.find(key), &value);
        for (char c : key) h = h * 31 + uint8_t(c);
        h = h * 31 + walk_value(value, 0);
        h += value.to_display_string().size();
    }
    EXPECT_TRUE(f.tensors().empty() || f.data_offset() <= bytes.size());
    const uint8_t *const begin = bytes.data();
    const uint8_t *const end = bytes.data() + bytes.size();
    std::vector<const TensorInfo *> by_offset;
    for (const TensorInfo &t : f.tensors()) {
        EXPECT_EQ(f.find_tensor(t.name), &t);
        EXPECT_TRUE(!t.ne.empty() && t.ne.size() <= 4);
        int64_t n = 1;
        for (int64_t d : t.ne) {
            EXPECT_GT(d, 0);
            n *= d;
        }
        EXPECT_EQ(t.n_elements, n);
        const DTypeInfo &info = dtype_info(t.type);
        EXPECT_EQ(t.ne[0] % info.block_size, 0);
        EXPECT_EQ(t.n_bytes, n / info.block_size * info.type_size);
        EXPECT_EQ(t.offset % f.alignment(), 0u);
        // The extent is inside the buffer; compare as integers, not by forming out-of-range pointers.
        EXPECT_EQ(t.data, begin + f.data_offset() + t.offset);
        const auto pos = uint64_t(t.data - begin);
        if (pos > bytes.size() || uint64_t(t.n_bytes) > bytes.size() - pos) {
            ADD_FAILURE() << "tensor '" << t.name << "' is outside the buffer";
            continue;
        }
        EXPECT_LE(t.data + t.n_bytes, end);
        uint64_t sum = 0;
        for (int64_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];  // ASan flags any byte past the end
        // Not the offset: a write-back may lay the data out differently.
        for (char c : t.name) h = h * 31 + uint8_t(c);
        h = h * 31 + sum + uint64_t(t.n_bytes) + uint64_t(t.type);
        by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(), [](auto *a, auto *b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        EXPECT_LE(by_offset[i - 1]->offset + uint64_t(by_offset[i - 1]->n_bytes), by_offset[i]->offset)
            << "tensors '" << by_offset[i - 1]->name << "' and '" << by_offset[i]->name << "' overlap";
    }
    return h;
}

// A parsed file written back reads back the same, and writing that again changes no byte.
void check_write_back(const File &f, uint64_t fingerprint) {
    std::vector<uint8_t> again;
    try {
        again = Writer::from_file(f).to_bytes();
    } catch (const Error &e) {
        ADD_FAILURE() << "the writer refused a file the reader accepted: " << e.what();
        return;
    }
    const std::unique_ptr<uint8_t[]> copy(new uint8_t[again.size()]);
    std::memcpy(copy.get(), again.data(), again.size());
    const std::span<const uint8_t> span(copy.get(), again.size());
    try {
        const File g = File::parse(span, "<rewritten>");
        // The same content (the layout may differ: v2 becomes v3, tensors are packed in order, padding zeroed).
        EXPECT_EQ(check_parsed(g, span), fingerprint) << "the rewritten file reads back differently";
        EXPECT_EQ(Writer::from_file(g).to_bytes(), again) << "writing is not a fixed point";
    } catch (const Error &e) {
        ADD_FAILURE() << "a rewritten file does not parse: " << e.what();
    }
}

// The kind of an error, for the coverage summary: its message with numbers and quoted names removed.
std::string error_kind(const std::string &message) {
    if (message.find("bad magic") != std::string::npos) return "not a GGUF file: bad magic";  // hex digits vary
    std::string out;
    bool in_quote = false;
    for (char c : message.substr(std::min(message.size(), std::strlen(kName) + 2))) {
        if (c == '\'') {
            in_quote = !in_quote;
            if (in_quote) out += "'*'";
            continue;
        }
        if (in_quote) continue;
        if (c >= '0' && c <= '9') {
            if (out.empty() || out.back() != '#') out += '#';
            continue;
        }
        out += c;
    }
    return out;
}

TEST(GgufFuzz, MutatedFilesParseOrFailCleanly) {
    const uint64_t iterations = env_or("SPARROW_FUZZ_ITERATIONS", 30000);
    const uint64_t seed = env_or("SPARROW_FUZZ_SEED", 0x5eed);
    const auto seeds = make_seeds();
    for (const auto &s : seeds) {  // the seeds themselves must be valid
        const File f = File::parse(s, "<seed>");
        check_write_back(f, check_parsed(f, s));
    }
    Mutator mutator(seeds, seed);
    uint64_t n_ok = 0, n_error = 0;
    std::map<std::string, uint64_t> kinds;
    double worst_ms = 0;
    const auto start = std::chrono::steady_clock::now();
    for (uint64_t it = 0; it < iterations; ++it) {
        const std::vector<uint8_t> mutated = mutator.next();
        // Exactly sized, so that a read one byte past the end is an ASan report (a vector may have spare capacity).
        const std::unique_ptr<uint8_t[]> heap(new uint8_t[mutated.size()]);
        if (!mutated.empty()) std::memcpy(heap.get(), mutated.data(), mutated.size());
        const std::span<const uint8_t> bytes(heap.get(), mutated.size());
        const auto t0 = std::chrono::steady_clock::now();
        try {
            const File f = File::parse(bytes, kName);
            ++n_ok;
            check_write_back(f, check_parsed(f, bytes));
        } catch (const Error &e) {
            ++n_error;
            const std::string message = e.what();
            EXPECT_EQ(message.rfind(kName, 0), 0u) << "the message does not name the file: " << message;
            ++kinds[error_kind(message)];
        } catch (const std::exception &e) {
            ADD_FAILURE() << "iteration " << it << ": not a sparrow::Error: " << e.what();
        }
        worst_ms = std::max(worst_ms,
                            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        if (::testing::Test::HasFailure()) {
            ADD_FAILURE() << "stopping at iteration " << it << " (SPARROW_FUZZ_SEED=" << seed << ")";
            break;
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("gguf fuzz: %llu iterations in %.2f s (slowest %.2f ms): %llu parsed, %llu errors of %zu kinds\n",
                (unsigned long long)iterations, seconds, worst_ms, (unsigned long long)n_ok,
                (unsigned long long)n_error, kinds.size());
    for (const auto &[kind, count] : kinds) std::printf("  %6llu  %s\n", (unsigned long long)count, kind.c_str());
    // The mutations must reach both outcomes and many different checks, or the fuzzer proves little.
    if (iterations >= 10000) {
        EXPECT_GT(n_ok, iterations / 20);
        EXPECT_GT(n_error, iterations / 4);
        EXPECT_GE(kinds.size(), 20u);
    }
}

}  // namespace
}  // namespace sparrow::gguf
