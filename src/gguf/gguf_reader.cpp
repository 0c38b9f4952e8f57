#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "gguf/gguf.h"

namespace sparrow::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxDims = 4;              // GGML_MAX_DIMS
// A Value is ~48 bytes for a 1-byte u8 element: reserving a count in full would let each array level of a
// small malformed file claim ~48x its remaining size before the elements fail to parse. Beyond this many,
// vectors grow as elements actually arrive.
constexpr uint64_t kMaxReserve = 4096;

// A bounds-checked cursor over the header bytes. Every read names what it was reading when it runs out.
class Cursor {
  public:
    Cursor(std::span<const uint8_t> bytes, const std::string &file) : bytes_(bytes), file_(file) {}

    uint64_t pos() const { return pos_; }
    uint64_t remaining() const { return bytes_.size() - pos_; }

    void need(uint64_t n, const char *what) const {
        if (n > remaining()) {
            throw_error("%s: truncated file: %s needs %llu bytes at offset %llu but only %llu remain", file_.c_str(),
                        what, (unsigned long long)n, (unsigned long long)pos_, (unsigned long long)remaining());
        }
    }

    template <typename T>
    T read(const char *what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string read_string(const char *what) {
        const uint64_t n = read<uint64_t>(what);
        need(n, what);  // also rejects absurd lengths before any allocation
        std::string s(reinterpret_cast<const char *>(bytes_.data() + pos_), static_cast<size_t>(n));
        pos_ += n;
        return s;
    }

    [[noreturn]] void fail(const std::string &message) const {
        throw_error("%s: %s (at offset %llu)", file_.c_str(), message.c_str(), (unsigned long long)pos_);
    }

  private:
    std::span<const uint8_t> bytes_;
    const std::string &file_;
    uint64_t pos_ = 0;
};

// A key or tensor name as it appears in an error message: quoted, bytes outside printable ASCII escaped,
// and cut after 80 bytes. Names come from the file: pasted raw, a NUL would end the message early (it goes
// through printf's %s), and a megabyte-long name would make a megabyte-long message.
std::string quoted(const std::string &name) {
    constexpr size_t kMaxShown = 80;
    std::string out = "'";
    for (size_t i = 0; i < name.size() && i < kMaxShown; ++i) {
        const auto ch = static_cast<unsigned char>(name[i]);
        if (ch < 0x20 || ch == 0x7f || ch == '\\' || ch == '\'')
            out += strprintf("\\x%02x", ch);
        else
            out += static_cast<char>(ch);  // UTF-8 bytes (>= 0x80) pass through: names are UTF-8
    }
    if (name.size() > kMaxShown)
        out += strprintf("'... (%zu bytes)", name.size());
    else
        out += "'";
    return out;
}

// The fewest bytes one element of a value type takes in the file; used to reject array counts that the
// remaining bytes cannot hold before reserving memory for them.
uint64_t min_encoded_size(ValueType t) {
    switch (t) {
        case ValueType::UINT8:
        case ValueType::INT8:
        case ValueType::BOOL: return 1;
        case ValueType::UINT16:
        case ValueType::INT16: return 2;
        case ValueType::UINT32:
        case ValueType::INT32:
        case ValueType::FLOAT32: return 4;
        case ValueType::UINT64:
        case ValueType::INT64:
        case ValueType::FLOAT64:
        case ValueType::STRING: return 8;
        case ValueType::ARRAY: return 12;  // u32 type + u64 count
    }
    return 1;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::FLOAT64); }

Value read_value(Cursor &c, ValueType type, int depth, const std::string &key) {
    switch (type) {
        case ValueType::UINT8: return {type, uint64_t(c.read<uint8_t>("u8 value"))};
        case ValueType::INT8: return {type, int64_t(c.read<int8_t>("i8 value"))};
        case ValueType::UINT16: return {type, uint64_t(c.read<uint16_t>("u16 value"))};
        case ValueType::INT16: return {type, int64_t(c.read<int16_t>("i16 value"))};
        case ValueType::UINT32: return {type, uint64_t(c.read<uint32_t>("u32 value"))};
        case ValueType::INT32: return {type, int64_t(c.read<int32_t>("i32 value"))};
        case ValueType::UINT64: return {type, c.read<uint64_t>("u64 value")};
        case ValueType::INT64: return {type, c.read<int64_t>("i64 value")};
        case ValueType::FLOAT32: return {type, double(c.read<float>("f32 value"))};
        case ValueType::FLOAT64: return {type, c.read<double>("f64 value")};
        case ValueType::BOOL: {
            const uint8_t b = c.read<uint8_t>("bool value");
            if (b > 1) c.fail("metadata " + quoted(key) + ": bool value " + std::to_string(b) + " is neither 0 nor 1");
            return {type, b != 0};
        }
        case ValueType::STRING: return {type, c.read_string("string value")};
        case ValueType::ARRAY: {
            if (depth >= kMaxArrayDepth) c.fail("metadata " + quoted(key) + ": arrays nested too deeply");
            const uint32_t elem = c.read<uint32_t>("array element type");
            if (!valid_value_type(elem)) {
                c.fail("metadata " + quoted(key) + ": unknown array element type " + std::to_string(elem));
            }
            const uint64_t count = c.read<uint64_t>("array length");
            const auto elem_type = static_cast<ValueType>(elem);
            if (count > c.remaining() / min_encoded_size(elem_type)) {
                c.fail("metadata " + quoted(key) + ": array of " + std::to_string(count) +
                       " elements does not fit in the " + std::to_string(c.remaining()) + " bytes left");
            }
            Array arr;
            arr.type = elem_type;
            arr.items.reserve(static_cast<size_t>(std::min<uint64_t>(count, kMaxReserve)));
            for (uint64_t i = 0; i < count; ++i) arr.items.push_back(read_value(c, elem_type, depth + 1, key));
            return {type, std::move(arr)};
        }
    }
    c.fail("metadata " + quoted(key) + ": unknown value type");
}

bool mul_overflows(int64_t a, int64_t b, int64_t *out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

const char *value_type_name(ValueType t) {
    switch (t) {
        case ValueType::UINT8: return "u8";
        case ValueType::INT8: return "i8";
        case ValueType::UINT16: return "u16";
        case ValueType::INT16: return "i16";
        case ValueType::UINT32: return "u32";
        case ValueType::INT32: return "i32";
        case ValueType::FLOAT32: return "f32";
        case ValueType::BOOL: return "bool";
        case ValueType::STRING: return "str";
        case ValueType::ARRAY: return "arr";
        case ValueType::UINT64: return "u64";
        case ValueType::INT64: return "i64";
        case ValueType::FLOAT64: return "f64";
    }
    return "?";
}

// --- Value ------------------------------------------------------------------------------------------------

bool Value::is_integer() const {
    return std::holds_alternative<uint64_t>(data) || std::holds_alternative<int64_t>(data);
}

bool Value::is_number() const { return is_integer() || std::holds_alternative<double>(data); }

int64_t Value::as_int(const std::string &what) const {
    if (const auto *u = std::get_if<uint64_t>(&data)) {
        if (*u > uint64_t(std::numeric_limits<int64_t>::max()))
            throw_error("'%s': value %llu is too large", what.c_str(), (unsigned long long)*u);
        return int64_t(*u);
    }
    if (const auto *i = std::get_if<int64_t>(&data)) return *i;
    // A bool is not taken as 0 / 1: llama.cpp refuses a key of the wrong type, and a count written as a bool
    // (block_count true) would load a one-layer model silently.
    throw_error("'%s': expected an integer, found %s", what.c_str(), value_type_name(type));
}

double Value::as_double(const std::string &what) const {
    if (const auto *d = std::get_if<double>(&data)) return *d;
    if (is_integer()) return double(as_int(what));
    throw_error("'%s': expected a number, found %s", what.c_str(), value_type_name(type));
}

bool Value::as_bool(const std::string &what) const {
    if (const auto *b = std::get_if<bool>(&data)) return *b;
    if (is_integer()) return as_int(what) != 0;
    throw_error("'%s': expected a bool, found %s", what.c_str(), value_type_name(type));
}

const std::string &Value::as_string(const std::string &what) const {
    if (const auto *s = std::get_if<std::string>(&data)) return *s;
    throw_error("'%s': expected a string, found %s", what.c_str(), value_type_name(type));
}

const Array &Value::as_array(const std::string &what) const {
    if (const auto *a = std::get_if<Array>(&data)) return *a;
    throw_error("'%s': expected an array, found %s", what.c_str(), value_type_name(type));
}

std::string Value::to_display_string(size_t max_items) const {
    if (const auto *u = std::get_if<uint64_t>(&data)) return std::to_string(*u);
    if (const auto *i = std::get_if<int64_t>(&data)) return std::to_string(*i);
    if (const auto *d = std::get_if<double>(&data)) return strprintf("%.9g", *d);
    if (const auto *b = std::get_if<bool>(&data)) return *b ? "true" : "false";
    if (const auto *s = std::get_if<std::string>(&data)) {
        std::string out = "\"";
        for (char ch : s->size() > 120 ? s->substr(0, 120) : *s) {
            if (ch == '\n')
                out += "\\n";
            else if (ch == '"')
                out += "\\\"";
            else if (static_cast<unsigned char>(ch) < 0x20)
                out += strprintf("\\x%02x", static_cast<unsigned char>(ch));
            else
                out += ch;
        }
        out += s->size() > 120 ? "\"..." : "\"";
        return out;
    }
    const Array &a = std::get<Array>(data);
    std::string out = strprintf("[%s x %zu] [", value_type_name(a.type), a.items.size());
    for (size_t i = 0; i < a.items.size() && i < max_items; ++i) {
        if (i) out += ", ";
        out += a.items[i].to_display_string(max_items);
    }
    if (a.items.size() > max_items) out += ", ...";
    return out + "]";
}

std::string TensorInfo::shape_string() const {
    std::string s = "[";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "]";
}

// --- File -------------------------------------------------------------------------------------------------

File File::open(const std::string &path) {
    auto mapping = std::make_shared<MappedFile>(path);
    File f;
    f.mapping_ = mapping;
    f.bytes_ = std::span<const uint8_t>(mapping->data(), mapping->size());
    f.name_ = path;
    f.parse_all();
    return f;
}

File File::parse(std::span<const uint8_t> bytes, const std::string &name) {
    File f;
    f.bytes_ = bytes;
    f.name_ = name;
    f.parse_all();
    return f;
}

void File::parse_all() {
    Cursor c(bytes_, name_);
    if (bytes_.size() < 4) throw_error("%s: not a GGUF file: only %zu bytes", name_.c_str(), bytes_.size());
    const uint32_t magic = c.read<uint32_t>("magic");
    if (magic != kMagic) throw_error("%s: not a GGUF file: bad magic 0x%08x (expected \"GGUF\")", name_.c_str(), magic);
    version_ = c.read<uint32_t>("version");
    if (version_ == 0x02000000 || version_ == 0x03000000) {
        throw_error("%s: big-endian GGUF (version %u byte-swapped) is not supported", name_.c_str(), version_ >> 24);
    }
    if (version_ != 2 && version_ != 3) {
        throw_error("%s: unsupported GGUF version %u (sparrow reads versions 2 and 3)", name_.c_str(), version_);
    }
    const uint64_t n_tensors = c.read<uint64_t>("tensor count");
    const uint64_t n_kv = c.read<uint64_t>("metadata count");
    // Each metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at least 8 + 4
    // + 4 + 8 bytes. Counts the file cannot hold are rejected before anything is reserved.
    if (n_kv > c.remaining() / 13)
        throw_error("%s: metadata count %llu is larger than the file can hold", name_.c_str(),
                    (unsigned long long)n_kv);
    if (n_tensors > c.remaining() / 24)
        throw_error("%s: tensor count %llu is larger than the file can hold", name_.c_str(),
                    (unsigned long long)n_tensors);

    // The counts only passed a loose bound (several in-memory bytes per file byte); reserve no more than a
    // modest number up front so that a lying header cannot make us allocate far more than it holds.
    kv_.reserve(static_cast<size_t>(std::min<uint64_t>(n_kv, kMaxReserve)));
    for (uint64_t i = 0; i < n_kv; ++i) {
        std::string key = c.read_string("metadata key");
        const uint32_t type = c.read<uint32_t>("metadata value type");
        if (!valid_value_type(type)) c.fail("metadata " + quoted(key) + ": unknown value type " + std::to_string(type));
        Value v = read_value(c, static_cast<ValueType>(type), 0, key);
        if (kv_index_.count(key)) c.fail("duplicate metadata key " + quoted(key));
        kv_index_[key] = kv_.size();
        kv_.emplace_back(std::move(key), std::move(v));
    }

    if (const Value *a = find("general.alignment")) {
        // Checked by hand rather than with as_int(), whose errors would not name the file.
        const auto *u = std::get_if<uint64_t>(&a->data);
        const auto *i = std::get_if<int64_t>(&a->data);
        if (!u && !i) {
            throw_error("%s: general.alignment is a %s, not an integer", name_.c_str(), value_type_name(a->type));
        }
        if (i && *i <= 0) {
            throw_error("%s: general.alignment %lld is not a power of two in [1, 2^20]", name_.c_str(), (long long)*i);
        }
        const uint64_t align = u ? *u : uint64_t(*i);
        if (!is_valid_alignment(align)) {
            throw_error("%s: general.alignment %llu is not a power of two in [1, 2^20]", name_.c_str(),
                        (unsigned long long)align);
        }
        alignment_ = align;
    }

    tensors_.reserve(static_cast<size_t>(std::min<uint64_t>(n_tensors, kMaxReserve)));
    for (uint64_t i = 0; i < n_tensors; ++i) {
        TensorInfo t;
        t.name = c.read_string("tensor name");
        const uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
        if (n_dims == 0 || n_dims > kMaxDims)
            c.fail("tensor " + quoted(t.name) + ": " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
        t.n_elements = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const uint64_t ne = c.read<uint64_t>("tensor dimension");
            const auto which = [&] { return "tensor " + quoted(t.name) + ": dimension " + std::to_string(d); };
            if (ne == 0) c.fail(which() + " is 0 (empty tensors are not supported)");
            if (ne > uint64_t(std::numeric_limits<int64_t>::max()) ||
                mul_overflows(t.n_elements, int64_t(ne), &t.n_elements)) {
                c.fail(which() + " = " + std::to_string(ne) + " makes the element count overflow");
            }
            t.ne.push_back(int64_t(ne));
        }
        const uint32_t type = c.read<uint32_t>("tensor type");
        const auto info = dtype_info(type);
        if (!info) c.fail("tensor " + quoted(t.name) + ": unknown type id " + std::to_string(type));
        t.type = static_cast<DType>(type);
        if (t.ne[0] % info->block_size != 0) {
            c.fail("tensor " + quoted(t.name) + ": first dimension " + std::to_string(t.ne[0]) +
                   " is not a multiple of the " + std::string(info->name) + " block size " +
                   std::to_string(info->block_size));
        }
        if (mul_overflows(t.n_elements / info->block_size, info->type_size, &t.n_bytes)) {
            c.fail("tensor " + quoted(t.name) + ": byte size of " + std::to_string(t.n_elements) + " " +
                   std::string(info->name) + " elements overflows");
        }
        t.offset = c.read<uint64_t>("tensor offset");
        if (t.offset % alignment_ != 0) {
            c.fail("tensor " + quoted(t.name) + ": offset " + std::to_string(t.offset) +
                   " is not a multiple of the alignment " + std::to_string(alignment_));
        }
        if (tensor_index_.count(t.name)) c.fail("duplicate tensor name " + quoted(t.name));
        tensor_index_[t.name] = tensors_.size();
        tensors_.push_back(std::move(t));
    }

    data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
    if (data_offset_ > bytes_.size() && !tensors_.empty()) {
        throw_error("%s: truncated file: tensor data would start at %llu, past the end (%zu bytes)", name_.c_str(),
                    (unsigned long long)data_offset_, bytes_.size());
    }
    const uint64_t data_size = data_offset_ <= bytes_.size() ? bytes_.size() - data_offset_ : 0;

    // Extents: inside the data section, and no two tensors share bytes.
    std::vector<const TensorInfo *> by_offset;
    for (auto &t : tensors_) {
        if (t.offset > data_size || uint64_t(t.n_bytes) > data_size - t.offset) {
            throw_error(
                "%s: tensor %s (%s, %lld bytes at data offset %llu) extends past the end of the file "
                "(%llu data bytes): truncated file?",
                name_.c_str(), quoted(t.name).c_str(), std::string(dtype_name(t.type)).c_str(), (long long)t.n_bytes,
                (unsigned long long)t.offset, (unsigned long long)data_size);
        }
        t.data = bytes_.data() + data_offset_ + t.offset;
        by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(), [](auto *a, auto *b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        const TensorInfo &prev = *by_offset[i - 1];
        if (prev.offset + uint64_t(prev.n_bytes) > by_offset[i]->offset) {
            throw_error("%s: tensors %s and %s overlap in the data section", name_.c_str(), quoted(prev.name).c_str(),
                        quoted(by_offset[i]->name).c_str());
        }
    }
}

const Value *File::find(const std::string &key) const {
    const auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

int64_t File::get_int(const std::string &key, std::optional<int64_t> fallback) const {
    if (const Value *v = find(key)) return v->as_int(key);
    if (fallback) return *fallback;
    throw_error("%s: required metadata key '%s' is missing", name_.c_str(), key.c_str());
}

double File::get_float(const std::string &key, std::optional<double> fallback) const {
    if (const Value *v = find(key)) return v->as_double(key);
    if (fallback) return *fallback;
    throw_error("%s: required metadata key '%s' is missing", name_.c_str(), key.c_str());
}

bool File::get_bool(const std::string &key, std::optional<bool> fallback) const {
    if (const Value *v = find(key)) return v->as_bool(key);
    if (fallback) return *fallback;
    throw_error("%s: required metadata key '%s' is missing", name_.c_str(), key.c_str());
}

std::string File::get_string(const std::string &key, std::optional<std::string> fallback) const {
    if (const Value *v = find(key)) return v->as_string(key);
    if (fallback) return *fallback;
    throw_error("%s: required metadata key '%s' is missing", name_.c_str(), key.c_str());
}

const Array *File::get_array(const std::string &key) const {
    const Value *v = find(key);
    return v ? &v->as_array(key) : nullptr;
}

const TensorInfo *File::find_tensor(const std::string &name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace sparrow::gguf
