// Helpers shared by the GoogleTest files: paths to the source tree and ../shared/data, random data.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace sparrow::test {

// The repository root (compiled in by CMake).
std::string source_dir();
// The path of the built `sparrow` binary.
std::string sparrow_binary();
// ../shared/data next to the repository, or nullopt when it is absent (tests then GTEST_SKIP()).
std::optional<std::string> shared_data_dir();
// A fresh temporary directory, removed by the caller if it likes.
std::string make_temp_dir(const std::string &prefix);

std::vector<float> random_floats(std::mt19937 &rng, size_t n, float lo = -1.0f, float hi = 1.0f);

// The environment variable `name` as an unsigned number (decimal, 0x hex or 0 octal), or `fallback` when it is
// unset or empty: the fuzz tests' SPARROW_FUZZ_ITERATIONS and SPARROW_FUZZ_SEED.
uint64_t env_or(const char *name, uint64_t fallback);

// ||a - b|| / ||b|| (Euclidean norms, in double): how far logits a are from the expected b.
double rel_error(const std::vector<float> &a, const std::vector<float> &b);

}  // namespace sparrow::test

// Skips the current test with a message when ../shared/data is absent; else binds `var` to its path.
#define SPARROW_REQUIRE_SHARED_DATA(var)                                            \
    const auto var##_opt = ::sparrow::test::shared_data_dir();                      \
    if (!var##_opt) GTEST_SKIP() << "../shared/data is absent: skipping this test"; \
    const std::string var = *var##_opt
