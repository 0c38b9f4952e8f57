// Hyper-parameter readers shared by the architectures: a metadata value of the right type that is also in
// the range the forward pass can use, or a sparrow::Error naming the file, the key and the value. The GGUF
// getters check types only; a NaN RoPE base or an infinite norm epsilon would otherwise load and give NaN
// logits with nothing said.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "gguf/gguf.h"

namespace sparrow {

// Upper bound of counts and sizes read from metadata: products of two stay far inside int64.
constexpr int64_t kMaxHParam = int64_t(1) << 31;

// An integer in [lo, hi].
int64_t hparam_int(const gguf::File &f, const std::string &key, int64_t lo, int64_t hi,
                   std::optional<int64_t> fallback = std::nullopt);
// An integer in [1, 2^31]: counts and sizes.
inline int64_t hparam_positive(const gguf::File &f, const std::string &key,
                               std::optional<int64_t> fallback = std::nullopt) {
    return hparam_int(f, key, 1, kMaxHParam, fallback);
}

enum class FloatRange {
    finite,        // any finite value
    non_negative,  // finite and >= 0
    positive,      // finite and > 0
};
double hparam_float(const gguf::File &f, const std::string &key, double fallback, FloatRange range);

}  // namespace sparrow
