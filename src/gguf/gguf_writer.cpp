#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "gguf/gguf.h"

namespace sparrow::gguf {

namespace {

class ByteSink {
  public:
    std::vector<uint8_t> bytes;

    // resize + memcpy rather than insert: GCC 12 reports a false -Wstringop-overflow on insert here.
    void put_raw(const void *p, size_t n) {
        const size_t at = bytes.size();
        bytes.resize(at + n);
        if (n) std::memcpy(bytes.data() + at, p, n);
    }
    template <typename T>
    void put(T v) {
        put_raw(&v, sizeof(T));
    }
    void put_string(const std::string &s) {
        put<uint64_t>(s.size());
        put_raw(s.data(), s.size());
    }
    void pad_to(uint64_t alignment) {
        while (bytes.size() % alignment) bytes.push_back(0);
    }
};

// The integer in `v` as a T, or an error when it does not fit: a silent truncation (300 written as a u8 44)
// would produce a file that reads back with a different value.
template <typename T>
T checked_int(const Value &v, ValueType type, const std::string &key) {
    if (const auto *u = std::get_if<uint64_t>(&v.data)) {
        if (*u > uint64_t(std::numeric_limits<T>::max())) {
            throw_error("metadata '%s': value %llu does not fit in %s", key.c_str(), (unsigned long long)*u,
                        value_type_name(type));
        }
        return T(*u);
    }
    const int64_t i = v.as_int(key);
    // Compare in the signed domain only where T's range fits in it (T = uint64_t: just i >= 0).
    const bool too_small = std::numeric_limits<T>::is_signed ? i < int64_t(std::numeric_limits<T>::min()) : i < 0;
    const bool too_large = i >= 0 && uint64_t(i) > uint64_t(std::numeric_limits<T>::max());
    if (too_small || too_large) {
        throw_error("metadata '%s': value %lld does not fit in %s", key.c_str(), (long long)i, value_type_name(type));
    }
    return T(i);
}

void put_value(ByteSink &out, const Value &v, ValueType type, const std::string &key, int depth) {
    switch (type) {
        case ValueType::UINT8: out.put<uint8_t>(checked_int<uint8_t>(v, type, key)); return;
        case ValueType::INT8: out.put<int8_t>(checked_int<int8_t>(v, type, key)); return;
        case ValueType::UINT16: out.put<uint16_t>(checked_int<uint16_t>(v, type, key)); return;
        case ValueType::INT16: out.put<int16_t>(checked_int<int16_t>(v, type, key)); return;
        case ValueType::UINT32: out.put<uint32_t>(checked_int<uint32_t>(v, type, key)); return;
        case ValueType::INT32: out.put<int32_t>(checked_int<int32_t>(v, type, key)); return;
        case ValueType::UINT64: out.put<uint64_t>(checked_int<uint64_t>(v, type, key)); return;
        case ValueType::INT64: out.put<int64_t>(checked_int<int64_t>(v, type, key)); return;
        case ValueType::FLOAT32: out.put<float>(float(v.as_double(key))); return;
        case ValueType::FLOAT64: out.put<double>(v.as_double(key)); return;
        case ValueType::BOOL: out.put<uint8_t>(v.as_bool(key) ? 1 : 0); return;
        case ValueType::STRING: out.put_string(v.as_string(key)); return;
        case ValueType::ARRAY: {
            if (depth >= kMaxArrayDepth) throw_error("metadata '%s': arrays nested too deeply", key.c_str());
            const Array &a = v.as_array(key);
            // Checked even for an empty array, where no element would reach the switch below.
            if (static_cast<uint32_t>(a.type) > static_cast<uint32_t>(ValueType::FLOAT64)) {
                throw_error("metadata '%s': unknown array element type %u", key.c_str(), static_cast<unsigned>(a.type));
            }
            out.put<uint32_t>(static_cast<uint32_t>(a.type));
            out.put<uint64_t>(a.items.size());
            for (const Value &item : a.items) put_value(out, item, a.type, key, depth + 1);
            return;
        }
    }
    throw_error("metadata '%s': unknown value type %u", key.c_str(), static_cast<unsigned>(type));
}

}  // namespace

void Writer::set(const std::string &key, Value value) {
    for (auto &kv : kv_) {
        if (kv.first == key) {
            kv.second = std::move(value);
            return;
        }
    }
    kv_.emplace_back(key, std::move(value));
}

Writer Writer::from_file(const File &f) {
    Writer w;
    // Keys of a parsed file are unique already: append directly (set() would scan, quadratic in the count).
    w.kv_ = f.metadata();
    for (const TensorInfo &t : f.tensors()) w.add_tensor(t.name, t.type, t.ne, t.data, static_cast<size_t>(t.n_bytes));
    return w;
}

size_t Writer::check_new_tensor(const std::string &name, DType type, const std::vector<int64_t> &ne) const {
    // The same shape rules as the reader, checked here so that a bad shape is an error now rather than an
    // unreadable file later (or, for a first dimension off the block size, an assertion in dtype_row_size).
    if (ne.empty() || ne.size() > 4)
        throw_error("tensor '%s': %zu dimensions (1 to 4 allowed)", name.c_str(), ne.size());
    const DTypeInfo &info = dtype_info(type);  // throws for an unknown id
    int64_t n_elements = 1;
    for (size_t i = 0; i < ne.size(); ++i) {
        if (ne[i] <= 0 || __builtin_mul_overflow(n_elements, ne[i], &n_elements)) {
            throw_error("tensor '%s': dimension %zu = %lld is invalid", name.c_str(), i, (long long)ne[i]);
        }
    }
    if (ne[0] % info.block_size != 0) {
        throw_error("tensor '%s': first dimension %lld is not a multiple of the %s block size %lld", name.c_str(),
                    (long long)ne[0], std::string(info.name).c_str(), (long long)info.block_size);
    }
    int64_t expected = 0;
    if (__builtin_mul_overflow(n_elements / info.block_size, info.type_size, &expected)) {
        throw_error("tensor '%s': size overflows", name.c_str());
    }
    if (tensor_names_.count(name)) throw_error("duplicate tensor name '%s'", name.c_str());
    return static_cast<size_t>(expected);
}

void Writer::add_tensor(const std::string &name, DType type, std::vector<int64_t> ne, const void *data,
                        size_t n_bytes) {
    const size_t expected = check_new_tensor(name, type, ne);
    if (expected != n_bytes) {
        throw_error("tensor '%s': %zu bytes given, %zu expected for %s", name.c_str(), n_bytes, expected,
                    std::string(dtype_name(type)).c_str());
    }
    const auto *p = static_cast<const uint8_t *>(data);
    tensors_.push_back({name, type, std::move(ne), std::vector<uint8_t>(p, p + n_bytes), nullptr, n_bytes});
    tensor_names_.insert(name);
}

void Writer::add_tensor(const std::string &name, DType type, std::vector<int64_t> ne, FillFn fill) {
    const size_t n_bytes = check_new_tensor(name, type, ne);
    if (!fill) throw_error("tensor '%s': no data and no fill function", name.c_str());
    tensors_.push_back({name, type, std::move(ne), {}, std::move(fill), n_bytes});
    tensor_names_.insert(name);
}

namespace {

uint64_t alignment_of(const std::vector<std::pair<std::string, Value>> &kv) {
    uint64_t alignment = 32;
    for (const auto &[key, value] : kv) {
        if (key != "general.alignment") continue;
        // Unchecked, 0 divided by zero in pad_to and 3 wrote a file the reader rejects.
        const int64_t a = value.as_int(key);
        if (a <= 0 || !is_valid_alignment(uint64_t(a))) {
            throw_error("general.alignment %lld is not a power of two in [1, 2^20]", (long long)a);
        }
        alignment = uint64_t(a);
    }
    return alignment;
}

uint64_t padded(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

}  // namespace

std::vector<uint8_t> Writer::header_bytes() const {
    const uint64_t alignment = alignment_of(kv_);
    ByteSink out;
    out.put<uint32_t>(0x46554747);
    out.put<uint32_t>(3);
    out.put<uint64_t>(tensors_.size());
    out.put<uint64_t>(kv_.size());
    for (const auto &[key, value] : kv_) {
        out.put_string(key);
        out.put<uint32_t>(static_cast<uint32_t>(value.type));
        put_value(out, value, value.type, key, 0);
    }
    uint64_t offset = 0;
    for (const auto &t : tensors_) {
        out.put_string(t.name);
        out.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
        for (int64_t ne : t.ne) out.put<uint64_t>(static_cast<uint64_t>(ne));
        out.put<uint32_t>(static_cast<uint32_t>(t.type));
        out.put<uint64_t>(offset);
        offset += padded(t.n_bytes, alignment);
    }
    // No padding when no data follows: ggml writes tensor-less files (vocabularies) that way, and so a parsed
    // one is written back byte for byte.
    if (!tensors_.empty()) out.pad_to(alignment);
    return std::move(out.bytes);
}

std::vector<uint8_t> Writer::to_bytes() const {
    const uint64_t alignment = alignment_of(kv_);
    std::vector<uint8_t> bytes = header_bytes();
    for (const auto &t : tensors_) {
        const size_t at = bytes.size();
        bytes.resize(at + padded(t.n_bytes, alignment), 0);
        if (t.fill) {
            t.fill(bytes.data() + at, t.n_bytes);
        } else if (t.n_bytes) {
            std::memcpy(bytes.data() + at, t.data.data(), t.n_bytes);
        }
    }
    return bytes;
}

void Writer::write(const std::string &path) const {
    const std::vector<uint8_t> header = header_bytes();  // validates everything before the file is created
    const uint64_t alignment = alignment_of(kv_);
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) throw_error("cannot create '%s': %s", path.c_str(), std::strerror(errno));
    bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
    std::vector<uint8_t> buffer;  // one generated tensor at a time
    static const uint8_t zeros[64] = {};
    try {
        for (const auto &t : tensors_) {
            if (!ok) break;
            const uint8_t *data = t.data.data();
            if (t.fill) {
                buffer.assign(t.n_bytes, 0);
                t.fill(buffer.data(), t.n_bytes);
                data = buffer.data();
            }
            ok = std::fwrite(data, 1, t.n_bytes, f) == t.n_bytes;
            for (uint64_t pad = padded(t.n_bytes, alignment) - t.n_bytes; ok && pad > 0;) {
                const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof(zeros)));
                ok = std::fwrite(zeros, 1, n, f) == n;
                pad -= n;
            }
        }
    } catch (...) {
        std::fclose(f);
        throw;
    }
    const int saved_errno = errno;
    const bool closed = std::fclose(f) == 0;
    if (!ok || !closed) throw_error("cannot write '%s': %s", path.c_str(), std::strerror(ok ? errno : saved_errno));
}

}  // namespace sparrow::gguf
