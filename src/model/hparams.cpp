#include "model/hparams.h"

#include <cmath>

#include "core/error.h"

namespace sparrow {

int64_t hparam_int(const gguf::File &f, const std::string &key, int64_t lo, int64_t hi,
                   std::optional<int64_t> fallback) {
    const int64_t v = f.get_int(key, fallback);
    if (v < lo || v > hi) {
        throw_error("%s: '%s' = %lld is out of range [%lld, %lld]", f.name().c_str(), key.c_str(), (long long)v,
                    (long long)lo, (long long)hi);
    }
    return v;
}

double hparam_float(const gguf::File &f, const std::string &key, double fallback, FloatRange range) {
    const double v = f.get_float(key, fallback);
    const bool ok =
        std::isfinite(v) && (range == FloatRange::finite || (range == FloatRange::non_negative && v >= 0.0) ||
                             (range == FloatRange::positive && v > 0.0));
    if (!ok) {
        const char *want = range == FloatRange::finite         ? "a finite number"
                           : range == FloatRange::non_negative ? "a finite number >= 0"
                                                               : "a finite number > 0";
        throw_error("%s: '%s' = %g must be %s", f.name().c_str(), key.c_str(), v, want);
    }
    return v;
}

}  // namespace sparrow
