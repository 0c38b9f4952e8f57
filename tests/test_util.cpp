#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

namespace sparrow::test {

std::string source_dir() { return SPARROW_SOURCE_DIR; }
std::string sparrow_binary() { return SPARROW_BINARY; }

std::optional<std::string> shared_data_dir() {
    // SPARROW_SHARED_DATA overrides the location (pointing it at a missing folder shows how the suite
    // behaves for someone without ../shared).
    const char *env = std::getenv("SPARROW_SHARED_DATA");
    const std::filesystem::path p =
        env ? std::filesystem::path(env) : std::filesystem::path(source_dir()) / ".." / "shared" / "data";
    if (std::filesystem::is_directory(p)) return std::filesystem::canonical(p).string();
    return std::nullopt;
}

std::string make_temp_dir(const std::string &prefix) {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (!mkdtemp(tmpl.data())) return {};
    return tmpl;
}

std::vector<float> random_floats(std::mt19937 &rng, size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto &x : v) x = dist(rng);
    return v;
}

uint64_t env_or(const char *name, uint64_t fallback) {
    const char *s = std::getenv(name);
    return s && *s ? std::strtoull(s, nullptr, 0) : fallback;
}

double rel_error(const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace sparrow::test
