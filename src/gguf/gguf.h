// GGUF v3 (and v2) files: a validating reader over a memory mapping, and a writer.
//
// File layout (little-endian):
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x { string key | u32 value_type | value }           string = u64 length + bytes (no NUL)
//   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   padding to `general.alignment` (default 32) | tensor data (offsets are relative to its start)
// The reader checks everything before it is used: every length and count against the bytes left, every
// tensor's shape, type, alignment and extent, overlaps between tensors. A malformed file is a sparrow::Error
// that says what is wrong and where; nothing is read outside the buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace sparrow::gguf {

enum class ValueType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};
const char *value_type_name(ValueType t);

// `general.alignment` must be a power of two no larger than this; the reader and the writer agree on it.
constexpr uint64_t kMaxAlignment = uint64_t(1) << 20;
inline bool is_valid_alignment(uint64_t a) { return a != 0 && (a & (a - 1)) == 0 && a <= kMaxAlignment; }
// Arrays nest at most this many levels (a top-level array is level 1); deeper ones are rejected by both
// the reader (stack safety on hostile files) and the writer (so that it never writes an unreadable file).
constexpr int kMaxArrayDepth = 8;

struct Value;
struct Array {
    ValueType type = ValueType::UINT8;  // element type (ARRAY for nested arrays)
    std::vector<Value> items;
};

// One metadata value. `data` holds: uint64_t for unsigned integers, int64_t for signed, double for floats,
// bool, std::string, or Array; `type` keeps the exact GGUF type so that a file can be written back unchanged.
struct Value {
    ValueType type = ValueType::UINT8;
    std::variant<uint64_t, int64_t, double, bool, std::string, Array> data;

    static Value u8(uint8_t v) { return {ValueType::UINT8, uint64_t(v)}; }
    static Value i8(int8_t v) { return {ValueType::INT8, int64_t(v)}; }
    static Value u16(uint16_t v) { return {ValueType::UINT16, uint64_t(v)}; }
    static Value i16(int16_t v) { return {ValueType::INT16, int64_t(v)}; }
    static Value u32(uint32_t v) { return {ValueType::UINT32, uint64_t(v)}; }
    static Value i32(int32_t v) { return {ValueType::INT32, int64_t(v)}; }
    static Value u64(uint64_t v) { return {ValueType::UINT64, v}; }
    static Value i64(int64_t v) { return {ValueType::INT64, v}; }
    static Value f32(float v) { return {ValueType::FLOAT32, double(v)}; }
    static Value f64(double v) { return {ValueType::FLOAT64, v}; }
    static Value boolean(bool v) { return {ValueType::BOOL, v}; }
    static Value str(std::string v) { return {ValueType::STRING, std::move(v)}; }
    static Value array(ValueType elem, std::vector<Value> items) {
        return {ValueType::ARRAY, Array{elem, std::move(items)}};
    }

    bool is_integer() const;
    bool is_number() const;
    // Conversions that throw sparrow::Error when the value is not of a compatible type or out of range;
    // `what` names the value in the message (usually the key).
    int64_t as_int(const std::string &what) const;
    double as_double(const std::string &what) const;
    bool as_bool(const std::string &what) const;
    const std::string &as_string(const std::string &what) const;
    const Array &as_array(const std::string &what) const;
    std::string to_display_string(size_t max_items = 8) const;  // for `inspect`
};

struct TensorInfo {
    std::string name;
    DType type = DType::F32;
    std::vector<int64_t> ne;  // ggml order: ne[0] is the innermost (contiguous) dimension
    uint64_t offset = 0;      // from the start of the data section
    int64_t n_elements = 0;
    int64_t n_bytes = 0;
    const uint8_t *data = nullptr;  // into the mapping

    int64_t dim(size_t i) const { return i < ne.size() ? ne[i] : 1; }
    std::string shape_string() const;  // "[64, 512]"
};

class File {
  public:
    // Maps and validates a file. Throws sparrow::Error (naming the file) when it is not a valid GGUF.
    static File open(const std::string &path);
    // Validates a GGUF held in memory; the buffer must outlive the File (used by tests and fuzzing).
    static File parse(std::span<const uint8_t> bytes, const std::string &name = "<memory>");

    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }
    const std::string &name() const { return name_; }
    size_t size_bytes() const { return bytes_.size(); }
    // Whether the bytes are a file mapping (open) rather than a caller's buffer (parse).
    bool mapped() const { return mapping_ != nullptr; }

    // Metadata in file order.
    const std::vector<std::pair<std::string, Value>> &metadata() const { return kv_; }
    const Value *find(const std::string &key) const;
    bool has(const std::string &key) const { return find(key) != nullptr; }
    // Typed getters: a missing key returns `fallback` (or throws when there is none); a value of the wrong
    // type or out of range throws an error naming the key.
    int64_t get_int(const std::string &key, std::optional<int64_t> fallback = std::nullopt) const;
    double get_float(const std::string &key, std::optional<double> fallback = std::nullopt) const;
    bool get_bool(const std::string &key, std::optional<bool> fallback = std::nullopt) const;
    std::string get_string(const std::string &key, std::optional<std::string> fallback = std::nullopt) const;
    const Array *get_array(const std::string &key) const;  // nullptr when missing

    const std::vector<TensorInfo> &tensors() const { return tensors_; }
    const TensorInfo *find_tensor(const std::string &name) const;

  private:
    std::shared_ptr<MappedFile> mapping_;  // keeps the bytes alive when opened from a path
    std::span<const uint8_t> bytes_;
    std::string name_;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string, Value>> kv_;
    std::map<std::string, size_t> kv_index_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t> tensor_index_;

    void parse_all();
};

// Writes a GGUF v3 file. Tensors are written in the order added, each aligned to `general.alignment`.
// The writer refuses (with a sparrow::Error) anything the reader would reject, so that what it writes
// always reads back: shapes, duplicate tensor names, alignment, integers out of range of their type.
class Writer {
  public:
    // The metadata and tensors of a parsed file, in file order (tensor data copied). A file that this
    // writer produced comes back byte for byte from to_bytes(); others are re-laid-out (v2 becomes v3,
    // tensors are packed in tensor-info order, padding is zeroed).
    static Writer from_file(const File &f);

    void set(const std::string &key, Value value);  // replaces an existing key, keeps its position
    // `data` must hold exactly dtype_row_size(type, ne[0]) * ne[1] * ... bytes; it is copied.
    void add_tensor(const std::string &name, DType type, std::vector<int64_t> ne, const void *data, size_t n_bytes);
    // A tensor whose bytes are produced only when the file is written: fill(dst, n_bytes) must write all
    // n_bytes (= dtype_row_size(type, ne[0]) * ne[1] * ...). write() streams such tensors one at a time,
    // so a large file never has all its data in memory. fill is called once per write() / to_bytes().
    using FillFn = std::function<void(uint8_t *dst, size_t n_bytes)>;
    void add_tensor(const std::string &name, DType type, std::vector<int64_t> ne, FillFn fill);
    void write(const std::string &path) const;  // throws sparrow::Error on I/O failure or an invalid value
    std::vector<uint8_t> to_bytes() const;

  private:
    struct PendingTensor {
        std::string name;
        DType type;
        std::vector<int64_t> ne;
        std::vector<uint8_t> data;  // empty when `fill` makes the bytes
        FillFn fill;
        size_t n_bytes = 0;
    };
    // Checks a new tensor's name and shape; returns its size in bytes.
    size_t check_new_tensor(const std::string &name, DType type, const std::vector<int64_t> &ne) const;
    std::vector<uint8_t> header_bytes() const;  // everything before the first tensor's data, padded
    std::vector<std::pair<std::string, Value>> kv_;
    std::vector<PendingTensor> tensors_;
    std::set<std::string> tensor_names_;  // duplicate names would make the file unreadable
};

}  // namespace sparrow::gguf
