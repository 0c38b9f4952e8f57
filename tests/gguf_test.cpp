// GGUF reader and writer: round trips of every value and tensor type, byte-identical rewriting, the real
// files in ../shared/data, and one test per kind of malformed input (each must be a sparrow::Error whose
// message names the problem and the file).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
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

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"
constexpr const char *kName = "bad.gguf";

// An exactly sized heap copy of a byte buffer: a std::vector may have spare capacity that hides a read one
// past the end from AddressSanitizer; this does not.
class HeapBytes {
  public:
    explicit HeapBytes(std::span<const uint8_t> bytes) : size_(bytes.size()), data_(new uint8_t[bytes.size()]) {
        if (size_) std::memcpy(data_.get(), bytes.data(), size_);
    }
    std::span<const uint8_t> span() const { return {data_.get(), size_}; }

  private:
    size_t size_;
    std::unique_ptr<uint8_t[]> data_;
};

// Hand-built GGUF bytes, for headers the Writer refuses to produce.
class Raw {
  public:
    std::vector<uint8_t> bytes;

    template <typename T>
    Raw &put(T v) {
        const size_t at = bytes.size();
        bytes.resize(at + sizeof(T));
        std::memcpy(bytes.data() + at, &v, sizeof(T));
        return *this;
    }
    Raw &str(const std::string &s) {
        put<uint64_t>(s.size());
        bytes.insert(bytes.end(), s.begin(), s.end());
        return *this;
    }
    Raw &header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        return put<uint32_t>(kMagic).put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
    }
    Raw &key(const std::string &k, ValueType t) { return str(k).put<uint32_t>(static_cast<uint32_t>(t)); }
    Raw &kv_u32(const std::string &k, uint32_t v) { return key(k, ValueType::UINT32).put<uint32_t>(v); }
    Raw &tensor(const std::string &name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
        str(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
        for (uint64_t n : ne) put<uint64_t>(n);
        return put<uint32_t>(type).put<uint64_t>(offset);
    }
    Raw &pad(size_t alignment) {
        while (bytes.size() % alignment) bytes.push_back(0);
        return *this;
    }
    Raw &zeros(size_t n) {
        bytes.resize(bytes.size() + n, 0);
        return *this;
    }
};

// The sparrow::Error message from parsing `bytes`; a test failure when it parses or throws anything else.
std::string parse_error(std::span<const uint8_t> bytes) {
    const HeapBytes copy(bytes);
    try {
        File::parse(copy.span(), kName);
    } catch (const Error &e) {
        return e.what();
    } catch (const std::exception &e) {
        ADD_FAILURE() << "threw a non-sparrow exception: " << e.what();
        return {};
    }
    ADD_FAILURE() << "parsed without an error";
    return {};
}

// Parsing must fail with a message that names the file and contains every one of `parts`.
void expect_parse_error(std::span<const uint8_t> bytes, std::initializer_list<const char *> parts) {
    const std::string message = parse_error(bytes);
    if (message.empty()) return;  // already reported
    EXPECT_NE(message.find(kName), std::string::npos) << "message does not name the file: " << message;
    for (const char *part : parts)
        EXPECT_NE(message.find(part), std::string::npos) << "missing '" << part << "' in: " << message;
}

// Deep equality, floats compared by bits (so -0.0 and NaN payloads count).
void expect_same_value(const Value &a, const Value &b, const std::string &where) {
    ASSERT_EQ(a.type, b.type) << where;
    ASSERT_EQ(a.data.index(), b.data.index()) << where;
    if (const auto *d = std::get_if<double>(&a.data)) {
        const double e = std::get<double>(b.data);
        EXPECT_EQ(std::memcmp(d, &e, sizeof(double)), 0) << where << ": " << *d << " vs " << e;
    } else if (const auto *arr = std::get_if<Array>(&a.data)) {
        const Array &brr = std::get<Array>(b.data);
        ASSERT_EQ(arr->type, brr.type) << where;
        ASSERT_EQ(arr->items.size(), brr.items.size()) << where;
        for (size_t i = 0; i < arr->items.size(); ++i) {
            expect_same_value(arr->items[i], brr.items[i], where + "[" + std::to_string(i) + "]");
        }
    } else if (const auto *u = std::get_if<uint64_t>(&a.data)) {
        EXPECT_EQ(*u, std::get<uint64_t>(b.data)) << where;
    } else if (const auto *i = std::get_if<int64_t>(&a.data)) {
        EXPECT_EQ(*i, std::get<int64_t>(b.data)) << where;
    } else if (const auto *flag = std::get_if<bool>(&a.data)) {
        EXPECT_EQ(*flag, std::get<bool>(b.data)) << where;
    } else {
        EXPECT_EQ(std::get<std::string>(a.data), std::get<std::string>(b.data)) << where;
    }
}

std::vector<uint8_t> read_whole_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> bytes(static_cast<size_t>(std::filesystem::file_size(path)));
    in.read(reinterpret_cast<char *>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(in.good()) << path;
    return bytes;
}

// Touches every scalar, string byte and array element of a value.
uint64_t touch(const Value &v) {
    if (const auto *a = std::get_if<Array>(&v.data)) {
        uint64_t h = a->items.size();
        for (const Value &item : a->items) h += touch(item);
        return h;
    }
    if (const auto *s = std::get_if<std::string>(&v.data)) {
        uint64_t h = s->size();
        for (char c : *s) h += static_cast<unsigned char>(c);
        return h;
    }
    return v.is_number() || std::holds_alternative<bool>(v.data) ? 1 : 0;
}

// Metadata of every type: scalars at their extremes, strings (empty, non-ASCII, with a NUL), arrays of each
// type, nested and empty arrays.
std::vector<std::pair<std::string, Value>> all_kinds_of_metadata() {
    using VT = ValueType;
    std::vector<std::pair<std::string, Value>> kv = {
        {"general.architecture", Value::str("llama")},
        {"t.u8.max", Value::u8(255)},
        {"t.u8.zero", Value::u8(0)},
        {"t.i8.min", Value::i8(-128)},
        {"t.i8.max", Value::i8(127)},
        {"t.u16", Value::u16(65535)},
        {"t.i16", Value::i16(-32768)},
        {"t.u32", Value::u32(0xffffffffu)},
        {"t.i32", Value::i32(std::numeric_limits<int32_t>::min())},
        {"t.u64", Value::u64(std::numeric_limits<uint64_t>::max())},
        {"t.i64", Value::i64(std::numeric_limits<int64_t>::min())},
        {"t.f32", Value::f32(1.5f)},
        {"t.f32.neg_zero", Value::f32(-0.0f)},
        {"t.f32.inf", Value::f32(-std::numeric_limits<float>::infinity())},
        {"t.f32.denormal", Value::f32(std::numeric_limits<float>::denorm_min())},
        {"t.f32.nan", Value::f32(std::numeric_limits<float>::quiet_NaN())},
        {"t.f64", Value::f64(3.141592653589793)},
        {"t.f64.max", Value::f64(DBL_MAX)},
        {"t.bool.true", Value::boolean(true)},
        {"t.bool.false", Value::boolean(false)},
        {"t.str.empty", Value::str("")},
        {"t.str.ascii", Value::str("hello, world")},
        {"t.str.utf8", Value::str("h\xc3\xa9llo w\xc3\xb6rld \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x90\xa6")},
        {"t.str.nul", Value::str(std::string("a\0b", 3))},
        {"t.arr.u8", Value::array(VT::UINT8, {Value::u8(0), Value::u8(1), Value::u8(255)})},
        {"t.arr.i8", Value::array(VT::INT8, {Value::i8(-128), Value::i8(127)})},
        {"t.arr.u16", Value::array(VT::UINT16, {Value::u16(1), Value::u16(65535)})},
        {"t.arr.i16", Value::array(VT::INT16, {Value::i16(-1), Value::i16(32767)})},
        {"t.arr.u32", Value::array(VT::UINT32, {Value::u32(7), Value::u32(0xffffffffu)})},
        {"t.arr.i32", Value::array(VT::INT32, {Value::i32(-7), Value::i32(std::numeric_limits<int32_t>::max())})},
        {"t.arr.u64", Value::array(VT::UINT64, {Value::u64(0), Value::u64(std::numeric_limits<uint64_t>::max())})},
        {"t.arr.i64", Value::array(VT::INT64, {Value::i64(std::numeric_limits<int64_t>::max()), Value::i64(-1)})},
        {"t.arr.f32", Value::array(VT::FLOAT32, {Value::f32(0.25f), Value::f32(-1e30f)})},
        {"t.arr.f64", Value::array(VT::FLOAT64, {Value::f64(1e-300), Value::f64(-2.5)})},
        {"t.arr.bool", Value::array(VT::BOOL, {Value::boolean(true), Value::boolean(false), Value::boolean(true)})},
        {"t.arr.str", Value::array(VT::STRING, {Value::str("a"), Value::str(""), Value::str("\xe2\x96\x81the")})},
        {"t.arr.nested",
         Value::array(VT::ARRAY, {Value::array(VT::INT32, {Value::i32(1), Value::i32(2)}), Value::array(VT::INT32, {}),
                                  Value::array(VT::INT32, {Value::i32(3)})})},
        {"t.arr.nested_str", Value::array(VT::ARRAY, {Value::array(VT::STRING, {Value::str("x"), Value::str("yz")})})},
        {"t.arr.nested3",
         Value::array(VT::ARRAY, {Value::array(VT::ARRAY, {Value::array(VT::BOOL, {Value::boolean(true)})})})},
    };
    // An empty array of every element type, nested arrays included.
    for (uint32_t t = 0; t <= static_cast<uint32_t>(VT::FLOAT64); ++t) {
        const auto vt = static_cast<VT>(t);
        kv.emplace_back(std::string("t.arr.empty.") + value_type_name(vt), Value::array(vt, {}));
    }
    return kv;
}

struct TestTensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
};

// Tensors of every supported type with 1 to 4 dimensions, filled by quantising random floats.
std::vector<TestTensor> test_tensors(uint32_t seed) {
    std::mt19937 rng(seed);
    const std::vector<std::tuple<std::string, DType, std::vector<int64_t>>> shapes = {
        {"f32.1d", DType::F32, {7}},         {"f32.4d", DType::F32, {3, 2, 2, 2}},
        {"f16.2d", DType::F16, {5, 3}},      {"f16.1d", DType::F16, {1}},
        {"bf16.3d", DType::BF16, {4, 3, 2}}, {"bf16.4d", DType::BF16, {2, 1, 1, 3}},
        {"q8_0.1d", DType::Q8_0, {32}},      {"q8_0.4d", DType::Q8_0, {64, 2, 1, 3}},
        {"q4_0.2d", DType::Q4_0, {32, 3}},   {"q4_0.3d", DType::Q4_0, {96, 1, 2}},
    };
    std::vector<TestTensor> out;
    for (const auto &[name, type, ne] : shapes) {
        int64_t rows = 1;
        for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
        const int64_t row_bytes = dtype_row_size(type, ne[0]);
        TestTensor t{name, type, ne, std::vector<uint8_t>(static_cast<size_t>(row_bytes * rows))};
        for (int64_t r = 0; r < rows; ++r) {
            const auto x = test::random_floats(rng, static_cast<size_t>(ne[0]), -3.0f, 3.0f);
            quantize_row(type, x.data(), t.data.data() + r * row_bytes, ne[0]);
        }
        out.push_back(std::move(t));
    }
    return out;
}

Writer make_writer(uint64_t alignment, uint32_t seed) {
    Writer w;
    for (auto &[k, v] : all_kinds_of_metadata()) w.set(k, v);
    if (alignment != 32) w.set("general.alignment", Value::u32(static_cast<uint32_t>(alignment)));
    for (const auto &t : test_tensors(seed)) w.add_tensor(t.name, t.type, t.ne, t.data.data(), t.data.size());
    return w;
}

void expect_tensors_match(const File &f, std::span<const uint8_t> bytes, const std::vector<TestTensor> &expected) {
    ASSERT_EQ(f.tensors().size(), expected.size());
    EXPECT_EQ(f.data_offset() % f.alignment(), 0u);
    for (size_t i = 0; i < expected.size(); ++i) {
        const TensorInfo &t = f.tensors()[i];
        const TestTensor &e = expected[i];
        SCOPED_TRACE(e.name);
        EXPECT_EQ(t.name, e.name);
        EXPECT_EQ(t.type, e.type);
        EXPECT_EQ(t.ne, e.ne);
        int64_t n = 1;
        for (int64_t d : e.ne) n *= d;
        EXPECT_EQ(t.n_elements, n);
        ASSERT_EQ(t.n_bytes, static_cast<int64_t>(e.data.size()));
        EXPECT_EQ(t.offset % f.alignment(), 0u);
        // The pointer is at data_offset + offset in the buffer, and that position is aligned in the file.
        const auto pos = static_cast<uint64_t>(t.data - bytes.data());
        EXPECT_EQ(pos, f.data_offset() + t.offset);
        EXPECT_EQ(pos % f.alignment(), 0u);
        ASSERT_LE(pos + uint64_t(t.n_bytes), bytes.size());
        EXPECT_EQ(std::memcmp(t.data, e.data.data(), e.data.size()), 0);
        EXPECT_EQ(f.find_tensor(e.name), &t);
    }
    EXPECT_EQ(f.find_tensor("no.such.tensor"), nullptr);
}

// --- round trips ------------------------------------------------------------------------------------------

TEST(GgufRoundTrip, EveryMetadataType) {
    Writer w;
    const auto kv = all_kinds_of_metadata();
    for (const auto &[k, v] : kv) w.set(k, v);
    const std::vector<uint8_t> bytes = w.to_bytes();
    const HeapBytes copy(bytes);
    const File f = File::parse(copy.span());
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), 32u);
    EXPECT_TRUE(f.tensors().empty());
    ASSERT_EQ(f.metadata().size(), kv.size());
    for (size_t i = 0; i < kv.size(); ++i) {
        EXPECT_EQ(f.metadata()[i].first, kv[i].first) << "metadata order must be kept";
        expect_same_value(f.metadata()[i].second, kv[i].second, kv[i].first);
        ASSERT_NE(f.find(kv[i].first), nullptr);
        EXPECT_EQ(f.find(kv[i].first), &f.metadata()[i].second);
    }
    // Typed getters over the parsed values.
    EXPECT_EQ(f.get_int("t.u8.max"), 255);
    EXPECT_EQ(f.get_int("t.i8.min"), -128);
    EXPECT_EQ(f.get_int("t.i64"), std::numeric_limits<int64_t>::min());
    EXPECT_THROW(f.get_int("t.u64"), Error);  // above int64 max: an error, not a wrapped value
    EXPECT_EQ(f.get_float("t.f32"), 1.5);
    EXPECT_EQ(f.get_float("t.u16"), 65535.0);
    EXPECT_TRUE(f.get_bool("t.bool.true"));
    EXPECT_FALSE(f.get_bool("t.bool.false"));
    EXPECT_EQ(f.get_string("t.str.utf8"), "h\xc3\xa9llo w\xc3\xb6rld \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x90\xa6");
    EXPECT_EQ(f.get_string("t.str.nul").size(), 3u);
    EXPECT_EQ(f.get_string("t.str.empty"), "");
    EXPECT_EQ(f.get_int("missing", 42), 42);
    EXPECT_THROW(f.get_int("missing"), Error);
    EXPECT_THROW(f.get_string("t.u8.max"), Error);
    EXPECT_EQ(f.get_array("missing"), nullptr);
    ASSERT_NE(f.get_array("t.arr.str"), nullptr);
    EXPECT_EQ(f.get_array("t.arr.str")->items.size(), 3u);
    EXPECT_TRUE(std::isnan(f.get_float("t.f32.nan")));
    // Written back unchanged.
    EXPECT_EQ(Writer::from_file(f).to_bytes(), bytes);
}

class GgufTensorRoundTrip : public ::testing::TestWithParam<uint64_t> {};

TEST_P(GgufTensorRoundTrip, TensorsOfEveryTypeAndRank) {
    const uint64_t alignment = GetParam();
    const std::vector<uint8_t> bytes = make_writer(alignment, 7).to_bytes();
    const HeapBytes copy(bytes);
    const File f = File::parse(copy.span());
    EXPECT_EQ(f.alignment(), alignment);
    expect_tensors_match(f, copy.span(), test_tensors(7));
    // Rewriting the parsed file reproduces it byte for byte.
    EXPECT_EQ(Writer::from_file(f).to_bytes(), bytes);
}

TEST_P(GgufTensorRoundTrip, ThroughAFileOnDiskWithAlignedPointers) {
    const uint64_t alignment = GetParam();
    const std::string dir = test::make_temp_dir("sparrow_gguf_");
    ASSERT_FALSE(dir.empty());
    const std::string path = dir + "/t.gguf";
    make_writer(alignment, 11).write(path);
    {
        const File f = File::open(path);
        EXPECT_EQ(f.name(), path);
        const auto mapped = std::span<const uint8_t>(
            f.tensors().front().data - f.data_offset() - f.tensors().front().offset, f.size_bytes());
        expect_tensors_match(f, mapped, test_tensors(11));
        // The mapping starts on a page, so alignments up to a page hold for the pointers themselves.
        if (alignment <= 4096) {
            for (const auto &t : f.tensors()) EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % alignment, 0u) << t.name;
        }
        EXPECT_EQ(Writer::from_file(f).to_bytes(), read_whole_file(path));
    }
    std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufTensorRoundTrip, ::testing::Values(1, 8, 32, 64, 4096, uint64_t(1) << 20));

TEST(GgufRoundTrip, NestedArraysUpToTheDepthLimit) {
    // Eight levels of arrays read back; a ninth is refused by the writer as the reader would refuse it.
    Value v = Value::array(ValueType::UINT8, {Value::u8(9)});
    for (int level = 1; level < 8; ++level) v = Value::array(ValueType::ARRAY, {v});
    Writer w;
    w.set("deep", v);
    const auto bytes = w.to_bytes();
    const HeapBytes copy(bytes);
    const File f = File::parse(copy.span());
    expect_same_value(f.metadata()[0].second, v, "deep");
    w.set("deep", Value::array(ValueType::ARRAY, {v}));
    EXPECT_THROW(w.to_bytes(), Error);
}

TEST(GgufRoundTrip, Version2IsRead) {
    Raw r;
    r.header(1, 1, 2).kv_u32("general.alignment", 16).tensor("w", {4}, 0, 0).pad(16);
    r.put<float>(1).put<float>(2).put<float>(3).put<float>(4);
    const HeapBytes copy(r.bytes);
    const File f = File::parse(copy.span());
    EXPECT_EQ(f.version(), 2u);
    EXPECT_EQ(f.alignment(), 16u);
    ASSERT_EQ(f.tensors().size(), 1u);
    float x[4];
    std::memcpy(x, f.tensors()[0].data, sizeof(x));
    EXPECT_EQ(x[3], 4.0f);
}

TEST(GgufRoundTrip, SetReplacesAndKeepsPosition) {
    Writer w;
    w.set("a", Value::u32(1));
    w.set("b", Value::u32(2));
    w.set("a", Value::str("x"));
    const auto bytes = w.to_bytes();
    const HeapBytes copy(bytes);
    const File f = File::parse(copy.span());
    ASSERT_EQ(f.metadata().size(), 2u);
    EXPECT_EQ(f.metadata()[0].first, "a");
    EXPECT_EQ(f.get_string("a"), "x");
}

// --- the real files in ../shared/data ---------------------------------------------------------------------

// Every tensor inside the mapping, disjoint and aligned; every byte readable.
void check_file_invariants(const File &f) {
    std::vector<const TensorInfo *> by_offset;
    uint64_t checksum = 0;
    for (const auto &t : f.tensors()) {
        EXPECT_EQ(t.offset % f.alignment(), 0u) << t.name;
        EXPECT_LE(f.data_offset() + t.offset + uint64_t(t.n_bytes), f.size_bytes()) << t.name;
        EXPECT_EQ(t.n_bytes, dtype_row_size(t.type, t.ne[0]) * (t.n_elements / t.ne[0])) << t.name;
        for (int64_t i = 0; i < t.n_bytes; ++i) checksum += t.data[i];
        by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(), [](auto *a, auto *b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        EXPECT_LE(by_offset[i - 1]->offset + uint64_t(by_offset[i - 1]->n_bytes), by_offset[i]->offset);
    }
    for (const auto &[k, v] : f.metadata()) checksum += touch(v) + v.to_display_string().size();
    EXPECT_NE(checksum, 0u);
}

TEST(GgufRealFiles, Stories260K) {
    SPARROW_REQUIRE_SHARED_DATA(data);
    const std::string path = data + "/models/stories260K.gguf";
    if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
    const File f = File::open(path);
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_int("llama.embedding_length"), 64);
    EXPECT_EQ(f.get_int("llama.block_count"), 5);
    EXPECT_EQ(f.get_int("llama.attention.head_count"), 8);
    EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 4);
    const Array *tokens = f.get_array("tokenizer.ggml.tokens");
    ASSERT_NE(tokens, nullptr);
    EXPECT_EQ(tokens->type, ValueType::STRING);
    EXPECT_EQ(tokens->items.size(), 512u);
    ASSERT_FALSE(f.tensors().empty());
    // 5 layers x 9 tensors + token embedding + output norm (+ output unless tied).
    EXPECT_GE(f.tensors().size(), 47u);
    const TensorInfo *emb = f.find_tensor("token_embd.weight");
    ASSERT_NE(emb, nullptr);
    EXPECT_EQ(emb->ne, (std::vector<int64_t>{64, 512}));
    EXPECT_EQ(emb->type, DType::F32);
    check_file_invariants(f);
    EXPECT_EQ(Writer::from_file(f).to_bytes(), read_whole_file(path)) << "rewriting the parsed file changed it";
}

TEST(GgufRealFiles, Vocabularies) {
    SPARROW_REQUIRE_SHARED_DATA(data);
    const std::string dir = data + "/vocab";
    if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " is absent";
    int n_files = 0;
    for (const auto &entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().extension() != ".gguf") continue;
        SCOPED_TRACE(entry.path().string());
        ++n_files;
        const File f = File::open(entry.path().string());
        EXPECT_GE(f.version(), 2u);
        const Array *tokens = f.get_array("tokenizer.ggml.tokens");
        ASSERT_NE(tokens, nullptr);
        EXPECT_GT(tokens->items.size(), 100u);
        EXPECT_FALSE(f.get_string("tokenizer.ggml.model").empty());
        check_file_invariants(f);
        if (f.version() == 3) {
            EXPECT_TRUE(Writer::from_file(f).to_bytes() == read_whole_file(entry.path().string()))
                << "rewriting the parsed file changed it";
        }
    }
    if (n_files == 0) GTEST_SKIP() << "no .gguf files in " << dir;
}

// --- malformed inputs -------------------------------------------------------------------------------------

// A small valid file with metadata and two tensors, for the truncation loop and for patching.
std::vector<uint8_t> small_valid_file() {
    Writer w;
    w.set("general.architecture", Value::str("llama"));
    w.set("a.u32", Value::u32(5));
    w.set("a.arr", Value::array(ValueType::STRING, {Value::str("x"), Value::str("yz")}));
    w.set("a.nested", Value::array(ValueType::ARRAY, {Value::array(ValueType::INT16, {Value::i16(-3)})}));
    w.set("a.bool", Value::boolean(true));
    w.set("general.alignment", Value::u32(16));
    const float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    w.add_tensor("a", DType::F32, {4}, x, 16);
    w.add_tensor("b", DType::F16, {2, 2}, x, 8);
    return w.to_bytes();
}

TEST(GgufMalformed, TruncatedAtEveryByte) {
    const std::vector<uint8_t> bytes = small_valid_file();
    const HeapBytes full(bytes);
    const File f = File::parse(full.span());
    uint64_t end_of_data = 0;
    for (const auto &t : f.tensors())
        end_of_data = std::max(end_of_data, f.data_offset() + t.offset + uint64_t(t.n_bytes));
    ASSERT_LT(end_of_data, bytes.size()) << "the last tensor should be followed by padding";
    for (size_t n = 0; n < end_of_data; ++n) {
        SCOPED_TRACE("truncated to " + std::to_string(n) + " bytes");
        const std::string message = parse_error(std::span<const uint8_t>(bytes.data(), n));
        EXPECT_TRUE(message.find("truncated") != std::string::npos ||
                    message.find("larger than the file can hold") != std::string::npos ||
                    message.find("does not fit") != std::string::npos ||
                    message.find("not a GGUF file") != std::string::npos)
            << message;
        EXPECT_NE(message.find(kName), std::string::npos) << message;
    }
    // Trailing padding after the last tensor is optional.
    for (size_t n = end_of_data; n <= bytes.size(); ++n) {
        const HeapBytes copy(std::span<const uint8_t>(bytes.data(), n));
        EXPECT_NO_THROW(File::parse(copy.span())) << n;
    }
}

TEST(GgufMalformed, BadMagic) {
    std::vector<uint8_t> bytes = small_valid_file();
    bytes[0] = 'X';
    expect_parse_error(bytes, {"not a GGUF file", "bad magic"});
    expect_parse_error(std::vector<uint8_t>{'G', 'G'}, {"not a GGUF file", "2 bytes"});
    expect_parse_error(std::vector<uint8_t>{}, {"not a GGUF file", "0 bytes"});
}

TEST(GgufMalformed, Version1) { expect_parse_error(Raw().header(0, 0, 1).bytes, {"unsupported GGUF version 1"}); }

TEST(GgufMalformed, Version4) { expect_parse_error(Raw().header(0, 0, 4).bytes, {"unsupported GGUF version 4"}); }

TEST(GgufMalformed, BigEndianFileIsNamedAsSuch) {
    // Before: "unsupported GGUF version 50331648".
    expect_parse_error(Raw().header(0, 0, 0x03000000).bytes, {"big-endian"});
}

TEST(GgufMalformed, AbsurdTensorCount) {
    expect_parse_error(Raw().header(uint64_t(1) << 60, 0).zeros(64).bytes, {"tensor count 1152921504606846976"});
}

TEST(GgufMalformed, AbsurdMetadataCount) {
    expect_parse_error(Raw().header(0, uint64_t(1) << 60).zeros(64).bytes, {"metadata count 1152921504606846976"});
    expect_parse_error(Raw().header(0, ~uint64_t(0)).zeros(64).bytes, {"metadata count"});
}

TEST(GgufMalformed, AbsurdKeyLength) {
    Raw r;
    r.header(0, 1).put<uint64_t>(uint64_t(1) << 60).zeros(32);
    expect_parse_error(r.bytes, {"truncated", "metadata key", "1152921504606846976"});
}

TEST(GgufMalformed, AbsurdStringValueLength) {
    Raw r;
    r.header(0, 1).key("s", ValueType::STRING).put<uint64_t>(~uint64_t(0)).zeros(32);
    expect_parse_error(r.bytes, {"truncated", "string value"});
}

TEST(GgufMalformed, AbsurdTensorNameLength) {
    Raw r;
    r.header(1, 0).put<uint64_t>(uint64_t(1) << 60).zeros(64);
    expect_parse_error(r.bytes, {"truncated", "tensor name"});
}

TEST(GgufMalformed, AbsurdArrayLength) {
    Raw r;
    r.header(0, 1)
        .key("arr", ValueType::ARRAY)
        .put<uint32_t>(uint32_t(ValueType::UINT64))
        .put<uint64_t>(uint64_t(1) << 60)
        .zeros(64);
    expect_parse_error(r.bytes, {"'arr'", "array of 1152921504606846976 elements does not fit"});
    // Just over what the remaining bytes hold: 9 u64s in 64 bytes.
    Raw r2;
    r2.header(0, 1).key("arr", ValueType::ARRAY).put<uint32_t>(uint32_t(ValueType::UINT64)).put<uint64_t>(9).zeros(64);
    expect_parse_error(r2.bytes, {"'arr'", "array of 9 elements"});
}

TEST(GgufMalformed, UnknownValueType) {
    expect_parse_error(Raw().header(0, 1).str("k").put<uint32_t>(13).zeros(16).bytes, {"'k'", "unknown value type 13"});
    expect_parse_error(Raw().header(0, 1).str("k").put<uint32_t>(0xffffffffu).zeros(16).bytes,
                       {"unknown value type 4294967295"});
}

TEST(GgufMalformed, UnknownArrayElementType) {
    Raw r;
    r.header(0, 1).key("k", ValueType::ARRAY).put<uint32_t>(13).put<uint64_t>(0).zeros(16);
    expect_parse_error(r.bytes, {"'k'", "unknown array element type 13"});
}

TEST(GgufMalformed, UnknownTensorType) {
    expect_parse_error(Raw().header(1, 0).tensor("w", {4}, 4, 0).pad(32).zeros(64).bytes, {"'w'", "unknown type id 4"});
    expect_parse_error(Raw().header(1, 0).tensor("w", {4}, 1000, 0).pad(32).zeros(64).bytes, {"unknown type id 1000"});
}

TEST(GgufMalformed, ZeroDimensions) {
    expect_parse_error(Raw().header(1, 0).tensor("w", {}, 0, 0).pad(32).zeros(64).bytes, {"'w'", "0 dimensions"});
}

TEST(GgufMalformed, FiveDimensions) {
    expect_parse_error(Raw().header(1, 0).tensor("w", {1, 1, 1, 1, 1}, 0, 0).pad(32).zeros(64).bytes,
                       {"'w'", "5 dimensions"});
}

TEST(GgufMalformed, ZeroSizeDimension) {
    expect_parse_error(Raw().header(1, 0).tensor("w", {4, 0}, 0, 0).pad(32).zeros(64).bytes,
                       {"'w'", "dimension 1 is 0"});
}

TEST(GgufMalformed, DimensionProductOverflow) {
    const uint64_t big = uint64_t(1) << 32;
    expect_parse_error(Raw().header(1, 0).tensor("w", {big, big}, 0, 0).pad(32).zeros(64).bytes,
                       {"'w'", "dimension 1", "element count overflow"});
    expect_parse_error(Raw().header(1, 0).tensor("w", {uint64_t(1) << 63}, 0, 0).pad(32).zeros(64).bytes,
                       {"dimension 0", "overflow"});
    // The element count fits in int64 but its byte size does not.
    expect_parse_error(Raw().header(1, 0).tensor("w", {uint64_t(1) << 62}, 0, 0).pad(32).zeros(64).bytes,
                       {"'w'", "byte size", "overflows"});
}

TEST(GgufMalformed, FirstDimensionNotAMultipleOfTheBlockSize) {
    expect_parse_error(Raw().header(1, 0).tensor("w", {33, 2}, uint32_t(DType::Q8_0), 0).pad(32).zeros(256).bytes,
                       {"'w'", "first dimension 33", "q8_0 block size 32"});
}

TEST(GgufMalformed, OffsetNotAligned) {
    expect_parse_error(Raw().header(1, 0).tensor("w", {4}, 0, 4).pad(32).zeros(64).bytes,
                       {"'w'", "offset 4 is not a multiple of the alignment 32"});
}

TEST(GgufMalformed, TensorPastTheEnd) {
    expect_parse_error(Raw().header(1, 0).tensor("w", {16}, 0, 0).pad(32).zeros(63).bytes,
                       {"'w'", "extends past the end"});
    expect_parse_error(Raw().header(1, 0).tensor("w", {1}, 0, ~uint64_t(0) & ~uint64_t(31)).pad(32).zeros(64).bytes,
                       {"'w'", "extends past the end"});
    // No room even for the padding before the data section.
    expect_parse_error(Raw().header(1, 0).tensor("w", {1}, 0, 0).bytes, {"truncated file", "tensor data would start"});
}

TEST(GgufMalformed, OverlappingTensors) {
    expect_parse_error(Raw().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {4}, 0, 32).pad(32).zeros(128).bytes,
                       {"'a' and 'b' overlap"});
    // Same offset, and one tensor inside a later-listed larger one.
    expect_parse_error(Raw().header(2, 0).tensor("a", {4}, 0, 32).tensor("b", {4}, 0, 32).pad(32).zeros(128).bytes,
                       {"overlap"});
    expect_parse_error(Raw()
                           .header(3, 0)
                           .tensor("c", {4}, 0, 64)
                           .tensor("big", {32}, 0, 0)
                           .tensor("d", {4}, 0, 96)
                           .pad(32)
                           .zeros(256)
                           .bytes,
                       {"'big' and 'c' overlap"});
}

TEST(GgufMalformed, DuplicateKey) {
    expect_parse_error(Raw().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).bytes, {"duplicate metadata key 'k'"});
}

TEST(GgufMalformed, DuplicateTensorName) {
    expect_parse_error(Raw().header(2, 0).tensor("w", {4}, 0, 0).tensor("w", {4}, 0, 32).pad(32).zeros(64).bytes,
                       {"duplicate tensor name 'w'"});
}

TEST(GgufMalformed, AlignmentZero) {
    expect_parse_error(Raw().header(0, 1).kv_u32("general.alignment", 0).bytes,
                       {"general.alignment 0 is not a power of two"});
}

TEST(GgufMalformed, AlignmentThree) {
    expect_parse_error(Raw().header(0, 1).kv_u32("general.alignment", 3).bytes,
                       {"general.alignment 3 is not a power of two"});
}

TEST(GgufMalformed, AlignmentOtherBadValues) {
    expect_parse_error(Raw().header(0, 1).kv_u32("general.alignment", 1u << 21).bytes, {"general.alignment 2097152"});
    expect_parse_error(Raw().header(0, 1).key("general.alignment", ValueType::INT32).put<int32_t>(-32).bytes,
                       {"general.alignment -32"});
    expect_parse_error(Raw().header(0, 1).key("general.alignment", ValueType::UINT64).put<uint64_t>(~uint64_t(0)).bytes,
                       {"general.alignment 18446744073709551615"});
    // Before the fix this message came from Value::as_int and did not name the file.
    expect_parse_error(Raw().header(0, 1).key("general.alignment", ValueType::STRING).str("32").bytes,
                       {"general.alignment is a str, not an integer"});
    expect_parse_error(Raw().header(0, 1).key("general.alignment", ValueType::BOOL).put<uint8_t>(1).bytes,
                       {"general.alignment is a bool"});
}

TEST(GgufMalformed, BoolValueTwo) {
    expect_parse_error(Raw().header(0, 1).key("b", ValueType::BOOL).put<uint8_t>(2).bytes, {"'b'", "bool value 2"});
    Raw r;
    r.header(0, 1).key("bs", ValueType::ARRAY).put<uint32_t>(uint32_t(ValueType::BOOL)).put<uint64_t>(3);
    r.put<uint8_t>(1).put<uint8_t>(0).put<uint8_t>(0xff);
    expect_parse_error(r.bytes, {"'bs'", "bool value 255"});
}

TEST(GgufMalformed, DeeplyNestedArrays) {
    for (int levels : {9, 10000}) {
        Raw r;
        r.header(0, 1).key("deep", ValueType::ARRAY);
        for (int i = 0; i < levels - 1; ++i) r.put<uint32_t>(uint32_t(ValueType::ARRAY)).put<uint64_t>(1);
        r.put<uint32_t>(uint32_t(ValueType::UINT8)).put<uint64_t>(0);
        expect_parse_error(r.bytes, {"'deep'", "nested too deeply"});
    }
}

TEST(GgufMalformed, NamesWithControlBytesDoNotCutTheMessage) {
    // Before the fix the raw key went through printf's %s: the message ended at the NUL, losing the problem.
    expect_parse_error(Raw().header(0, 1).str(std::string("ke\0y", 4)).put<uint32_t>(77).bytes,
                       {"'ke\\x00y'", "unknown value type 77", "(at offset"});
    // A long name is cut in the message, not copied whole.
    const std::string long_name(100000, 'n');
    const std::string message = parse_error(Raw().header(1, 0).tensor(long_name, {4}, 1000, 0).bytes);
    EXPECT_NE(message.find("unknown type id 1000"), std::string::npos) << message;
    EXPECT_NE(message.find("(100000 bytes)"), std::string::npos) << message;
    EXPECT_LT(message.size(), 400u);
    // Overlap and extent errors are formatted separately; they escape names too.
    const std::string nul_a("a\0", 2), nul_b("b\0", 2);
    expect_parse_error(Raw().header(2, 0).tensor(nul_a, {16}, 0, 0).tensor(nul_b, {4}, 0, 32).pad(32).zeros(128).bytes,
                       {"'a\\x00' and 'b\\x00' overlap"});
}

TEST(GgufMalformed, NotAFile) {
    EXPECT_THROW(File::open("/nonexistent/x.gguf"), Error);
    EXPECT_THROW(File::open(test::source_dir()), Error);  // a directory
}

// --- the writer refuses what the reader would reject ------------------------------------------------------

TEST(GgufWriter, RejectsBadAlignment) {
    for (uint32_t a : {0u, 3u, 48u, 1u << 21}) {
        Writer w;
        w.set("general.alignment", Value::u32(a));
        // Before the fix, 0 divided by zero (SIGFPE) and the others wrote files the reader rejects.
        EXPECT_THROW(w.to_bytes(), Error) << a;
    }
}

TEST(GgufWriter, RejectsBadShapes) {
    const std::vector<uint8_t> buf(4096);
    Writer w;
    // Before the fix a first dimension off the block size tripped SPARROW_ASSERT (abort) in dtype_row_size.
    EXPECT_THROW(w.add_tensor("q", DType::Q8_0, {33}, buf.data(), 34), Error);
    EXPECT_THROW(w.add_tensor("z", DType::F32, {4, 0}, buf.data(), 0), Error);
    EXPECT_THROW(w.add_tensor("n", DType::F32, {-4}, buf.data(), 0), Error);
    EXPECT_THROW(w.add_tensor("o", DType::F32, {int64_t(1) << 40, int64_t(1) << 40}, buf.data(), 0), Error);
    EXPECT_THROW(w.add_tensor("d0", DType::F32, {}, buf.data(), 0), Error);
    EXPECT_THROW(w.add_tensor("d5", DType::F32, {1, 1, 1, 1, 1}, buf.data(), 4), Error);
    EXPECT_THROW(w.add_tensor("s", DType::F32, {4}, buf.data(), 15), Error);
    EXPECT_THROW(w.add_tensor("t", static_cast<DType>(4), {4}, buf.data(), 16), Error);
    w.add_tensor("w", DType::F32, {4}, buf.data(), 16);
    EXPECT_THROW(w.add_tensor("w", DType::F32, {4}, buf.data(), 16), Error);
    const auto bytes = w.to_bytes();
    const HeapBytes copy(bytes);
    EXPECT_EQ(File::parse(copy.span()).tensors().size(), 1u);
}

TEST(GgufWriter, RejectsIntegersOutOfRange) {
    // Before the fix these were truncated silently (300 written as a u8 44).
    const std::vector<Value> bad = {
        {ValueType::UINT8, uint64_t(300)},
        {ValueType::INT8, int64_t(-129)},
        {ValueType::UINT16, int64_t(-1)},
        {ValueType::INT32, uint64_t(1) << 31},
        {ValueType::UINT64, int64_t(-1)},
        {ValueType::INT64, ~uint64_t(0)},
        Value::array(ValueType::UINT8, {Value::u32(256)}),
    };
    for (const Value &v : bad) {
        Writer w;
        w.set("k", v);
        EXPECT_THROW(w.to_bytes(), Error) << v.to_display_string();
    }
    // In range across types is fine: a u64 0xff written as u8, an i64 -1 written as i8.
    Writer w;
    w.set("a", Value{ValueType::UINT8, uint64_t(255)});
    w.set("b", Value{ValueType::INT8, int64_t(-1)});
    const auto bytes = w.to_bytes();
    const HeapBytes copy(bytes);
    const File f = File::parse(copy.span());
    EXPECT_EQ(f.get_int("a"), 255);
    EXPECT_EQ(f.get_int("b"), -1);
}

TEST(GgufWriter, RejectsUnknownTypes) {
    Writer w;
    w.set("k", Value::array(static_cast<ValueType>(13), {}));  // empty: no element would catch it
    EXPECT_THROW(w.to_bytes(), Error);
    Writer w2;
    w2.set("k", Value{static_cast<ValueType>(99), uint64_t(1)});
    EXPECT_THROW(w2.to_bytes(), Error);
    Writer w3;
    w3.set("k", Value{ValueType::STRING, uint64_t(1)});  // type and data disagree
    EXPECT_THROW(w3.to_bytes(), Error);
}

TEST(GgufWriter, WriteToAnUnwritablePathIsAnError) {
    Writer w;
    EXPECT_THROW(w.write("/nonexistent/dir/x.gguf"), Error);
}

}  // namespace
}  // namespace sparrow::gguf
