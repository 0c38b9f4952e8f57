#include <cerrno>
#include <cstdio>
#include <cstring>

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

void put_value(ByteSink &out, const Value &v, ValueType type, const std::string &key) {
    switch (type) {
        case ValueType::UINT8: out.put<uint8_t>(uint8_t(v.as_int(key))); return;
        case ValueType::INT8: out.put<int8_t>(int8_t(v.as_int(key))); return;
        case ValueType::UINT16: out.put<uint16_t>(uint16_t(v.as_int(key))); return;
        case ValueType::INT16: out.put<int16_t>(int16_t(v.as_int(key))); return;
        case ValueType::UINT32: out.put<uint32_t>(uint32_t(v.as_int(key))); return;
        case ValueType::INT32: out.put<int32_t>(int32_t(v.as_int(key))); return;
        case ValueType::UINT64: {
            const auto *u = std::get_if<uint64_t>(&v.data);
            out.put<uint64_t>(u ? *u : uint64_t(v.as_int(key)));
            return;
        }
        case ValueType::INT64: out.put<int64_t>(v.as_int(key)); return;
        case ValueType::FLOAT32: out.put<float>(float(v.as_double(key))); return;
        case ValueType::FLOAT64: out.put<double>(v.as_double(key)); return;
        case ValueType::BOOL: out.put<uint8_t>(v.as_bool(key) ? 1 : 0); return;
        case ValueType::STRING: out.put_string(v.as_string(key)); return;
        case ValueType::ARRAY: {
            const Array &a = v.as_array(key);
            out.put<uint32_t>(static_cast<uint32_t>(a.type));
            out.put<uint64_t>(a.items.size());
            for (const Value &item : a.items) put_value(out, item, a.type, key);
            return;
        }
    }
    throw_error("metadata '%s': unknown value type", key.c_str());
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

void Writer::add_tensor(const std::string &name, DType type, std::vector<int64_t> ne, const void *data,
                        size_t n_bytes) {
    if (ne.empty() || ne.size() > 4) throw_error("tensor '%s': %zu dimensions (1 to 4 allowed)", name.c_str(), ne.size());
    int64_t n_rows = 1;
    for (size_t i = 1; i < ne.size(); ++i) n_rows *= ne[i];
    const int64_t expected = dtype_row_size(type, ne[0]) * n_rows;
    if (expected != static_cast<int64_t>(n_bytes)) {
        throw_error("tensor '%s': %zu bytes given, %lld expected for %s", name.c_str(), n_bytes, (long long)expected,
                    std::string(dtype_name(type)).c_str());
    }
    const auto *p = static_cast<const uint8_t *>(data);
    tensors_.push_back({name, type, std::move(ne), std::vector<uint8_t>(p, p + n_bytes)});
}

std::vector<uint8_t> Writer::to_bytes() const {
    uint64_t alignment = 32;
    for (const auto &kv : kv_) {
        if (kv.first == "general.alignment") alignment = static_cast<uint64_t>(kv.second.as_int(kv.first));
    }
    ByteSink out;
    out.put<uint32_t>(0x46554747);
    out.put<uint32_t>(3);
    out.put<uint64_t>(tensors_.size());
    out.put<uint64_t>(kv_.size());
    for (const auto &[key, value] : kv_) {
        out.put_string(key);
        out.put<uint32_t>(static_cast<uint32_t>(value.type));
        put_value(out, value, value.type, key);
    }
    uint64_t offset = 0;
    for (const auto &t : tensors_) {
        out.put_string(t.name);
        out.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
        for (int64_t ne : t.ne) out.put<uint64_t>(static_cast<uint64_t>(ne));
        out.put<uint32_t>(static_cast<uint32_t>(t.type));
        out.put<uint64_t>(offset);
        offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    out.pad_to(alignment);
    for (const auto &t : tensors_) {
        out.put_raw(t.data.data(), t.data.size());
        out.pad_to(alignment);
    }
    return std::move(out.bytes);
}

void Writer::write(const std::string &path) const {
    const std::vector<uint8_t> bytes = to_bytes();
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) throw_error("cannot create '%s': %s", path.c_str(), std::strerror(errno));
    const size_t written = std::fwrite(bytes.data(), 1, bytes.size(), f);
    const bool closed = std::fclose(f) == 0;
    if (written != bytes.size() || !closed) throw_error("cannot write '%s': %s", path.c_str(), std::strerror(errno));
}

}  // namespace sparrow::gguf
