// RowStore: write/read round trips per row type, exact row copies.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cache/row_store.h"

namespace sparrow {
namespace {

TEST(RowStore, ReadReturnsWhatWasWrittenUpToRowTypeRounding) {
    struct Case {
        DType type;
        float tol;  // relative to the value
    };
    for (const Case c : {Case{DType::F32, 0.0f}, Case{DType::F16, 1e-3f}, Case{DType::BF16, 8e-3f}}) {
        const int64_t width = 37;
        RowStore store(c.type, 5, width);
        std::vector<float> src(width), back(width);
        for (int64_t i = 0; i < width; ++i) src[i] = std::sin(0.7f * float(i)) * 3.0f;
        store.write(3, src.data());
        store.read(3, back.data());
        for (int64_t i = 0; i < width; ++i) EXPECT_NEAR(back[i], src[i], c.tol * std::fabs(src[i]) + 1e-7f) << i;
    }
}

TEST(RowStore, CopyRowIsExact) {
    const int64_t width = 19;
    RowStore store(DType::F16, 4, width);
    std::vector<float> src(width), a(width), b(width);
    for (int64_t i = 0; i < width; ++i) src[i] = 0.1f * float(i) - 0.9f;
    store.write(0, src.data());
    store.copy_row(0, 2);
    store.read(0, a.data());
    store.read(2, b.data());
    EXPECT_EQ(a, b);
    store.copy_row(2, 2);  // a no-op, not an overlapping memcpy
    store.read(2, b.data());
    EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace sparrow
