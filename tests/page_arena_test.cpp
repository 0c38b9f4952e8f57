// PageArena and ZeroedAllocator (core/page_arena.h): the memory of the weights repacked at load and of the cache rows.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/page_arena.h"

namespace sparrow {
namespace {

// This process's resident bytes (/proc/self/statm's second field, in pages).
size_t resident_bytes() {
    std::ifstream statm("/proc/self/statm");
    size_t total = 0, resident = 0;
    statm >> total >> resident;
    return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

bool aligned(const void *p) { return reinterpret_cast<uintptr_t>(p) % PageArena::kAlignment == 0; }

TEST(PageArena, HandsOutAlignedDisjointRangesInOrder) {
    PageArena arena(10000);
    EXPECT_EQ(arena.capacity(), 10000u);
    uint8_t *a = arena.allocate(100);  // awkward sizes: the next start rounds up to the alignment
    uint8_t *b = arena.allocate(1);
    uint8_t *c = arena.allocate(3000);
    for (const uint8_t *p : {a, b, c}) EXPECT_TRUE(aligned(p));
    EXPECT_GE(b, a + 100);
    EXPECT_GE(c, b + 1);
    EXPECT_EQ(arena.used(), static_cast<size_t>(c + 3000 - a));
    // Each range is writable and keeps what was written when the others are written.
    std::memset(a, 0x11, 100);
    std::memset(b, 0x22, 1);
    std::memset(c, 0x33, 3000);
    EXPECT_EQ(a[99], 0x11);
    EXPECT_EQ(b[0], 0x22);
    EXPECT_EQ(c[0], 0x33);
    EXPECT_EQ(c[2999], 0x33);
}

TEST(PageArena, FillsExactlyAndRefusesMore) {
    PageArena arena(256);
    EXPECT_NO_THROW(arena.allocate(200));
    // 200 rounds up to 256: nothing is left, not even a byte.
    EXPECT_THROW(arena.allocate(1), Error);
    PageArena exact(256);
    EXPECT_NO_THROW(exact.allocate(256));
    EXPECT_THROW(exact.allocate(1), Error);
    PageArena small(100);
    EXPECT_THROW(small.allocate(101), Error);
    EXPECT_EQ(small.used(), 0u);  // a refused allocation takes nothing
    EXPECT_NO_THROW(small.allocate(100));
}

TEST(PageArena, ReservesAddressSpaceOnly) {
    // 4 GiB reserved, two bytes far apart written: only the pages (huge or not) holding them become resident.
    constexpr size_t kBig = size_t(4) << 30;
    const size_t before = resident_bytes();
    PageArena arena(kBig);
    uint8_t *p = arena.allocate(kBig);
    p[0] = 1;
    p[kBig - 1] = 2;
    EXPECT_EQ(p[0] + p[kBig - 1], 3);
    EXPECT_LT(resident_bytes(), before + (size_t(64) << 20));
}

TEST(PageArena, EmptyAndMoved) {
    PageArena none;
    EXPECT_EQ(none.capacity(), 0u);
    EXPECT_THROW(none.allocate(1), Error);
    PageArena a(4096);
    uint8_t *p = a.allocate(64);
    p[63] = 7;
    PageArena b(std::move(a));
    EXPECT_EQ(a.capacity(), 0u);
    EXPECT_EQ(b.used(), 64u);
    EXPECT_EQ(p[63], 7);  // the memory moved with the arena, not copied
    PageArena c;
    c = std::move(b);
    EXPECT_EQ(c.capacity(), 4096u);
    EXPECT_EQ(p[63], 7);
    EXPECT_THROW(c.allocate(4096), Error);
}

TEST(PageArena, RefusesAnImpossibleReservation) { EXPECT_THROW(PageArena(SIZE_MAX - 1), Error); }

TEST(ZeroedAllocator, SmallAndLargeBuffersStartZeroAndHoldWhatIsWritten) {
    for (const size_t bytes : {size_t(1), size_t(100), (size_t(2) << 20) - 1, size_t(2) << 20, (size_t(5) << 20) + 3}) {
        auto *p = static_cast<uint8_t *>(allocate_zeroed(bytes));
        ASSERT_NE(p, nullptr);
        size_t nonzero = 0;
        for (size_t i = 0; i < bytes; ++i) nonzero += p[i] != 0;
        EXPECT_EQ(nonzero, 0u) << bytes;
        p[0] = 1;
        p[bytes - 1] = 2;
        EXPECT_EQ(p[0] + p[bytes - 1], bytes == 1 ? 4 : 3);
        free_zeroed(p, bytes);
    }
    free_zeroed(nullptr, 123);  // as free(nullptr)
}

// The end of the mapping (/proc/self/maps) that holds address p, or 0.
uintptr_t mapping_end(const void *p) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    const auto a = reinterpret_cast<uintptr_t>(p);
    while (std::getline(maps, line)) {
        const size_t dash = line.find('-');
        const uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
        const uintptr_t hi = std::stoull(line.substr(dash + 1), nullptr, 16);
        if (lo <= a && a < hi) return hi;
    }
    return 0;
}

TEST(ZeroedAllocator, ALargeBufferEndsAtItsLastPageNotAtAWholeHugePage) {
    // A large buffer asks for transparent huge pages, but its mapping ends at its last 4 KiB page: the kernel puts
    // a huge page only where a whole 2 MiB range lies inside the mapping, so the part past the last whole 2 MiB is
    // in ordinary pages, and a filled buffer is resident to its size. A mapping rounded up to whole huge pages kept
    // up to 2 MiB more a buffer resident: 42 MiB over a 16K context's 24 cache stores on the bench model.
    constexpr uintptr_t kSmall = 4096;
    for (const size_t bytes : {(size_t(2) << 20) + 4096 + 100, (size_t(6) << 20) + (size_t(300) << 10)}) {
        auto *p = static_cast<uint8_t *>(allocate_zeroed(bytes));
        std::memset(p, 1, bytes);
        const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
        EXPECT_EQ(mapping_end(p), (end + kSmall - 1) / kSmall * kSmall) << bytes;
        EXPECT_EQ(p[bytes - 1], 1);
        free_zeroed(p, bytes);
    }
}

TEST(ZeroedAllocator, VectorsAreZeroAndCommittedAsWritten) {
    // 512 MiB of floats: zero to read, and resident only where written (one element per 64 MiB).
    constexpr size_t kCount = size_t(128) << 20;
    const size_t before = resident_bytes();
    ZeroedVector<float> v(kCount);
    ASSERT_EQ(v.size(), kCount);
    for (size_t i = 0; i < kCount; i += kCount / 8) {
        ASSERT_EQ(v[i], 0.0f);
        v[i] = float(i);
    }
    EXPECT_EQ(v[kCount / 8], float(kCount / 8));
    EXPECT_LT(resident_bytes(), before + (size_t(64) << 20));
    // Copies and moves are ordinary vector ones.
    ZeroedVector<int32_t> small(1000);
    small[7] = 7;
    const ZeroedVector<int32_t> copy = small;
    EXPECT_EQ(copy, small);
    ZeroedVector<int32_t> moved = std::move(small);
    EXPECT_EQ(moved[7], 7);
    EXPECT_EQ(moved[8], 0);
}

// Whether the page holding p is resident (mincore).
bool resident(const void *p) {
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    unsigned char in_core = 0;
    const auto addr = reinterpret_cast<uintptr_t>(p) / page * page;
    if (::mincore(reinterpret_cast<void *>(addr), page, &in_core) != 0) return false;
    return (in_core & 1) != 0;
}

// An anonymous mapping in ordinary pages (no transparent huge page would commit 2 MiB at the first write).
struct SmallPages {
    size_t bytes;
    uint8_t *p;
    explicit SmallPages(size_t n) : bytes(n) {
        void *m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        p = m == MAP_FAILED ? nullptr : static_cast<uint8_t *>(m);
        if (p) ::madvise(p, n, MADV_NOHUGEPAGE);
    }
    ~SmallPages() {
        if (p) ::munmap(p, bytes);
    }
};

TEST(CommitAhead, CommitsTheChunksAWriteTouchesAndNoOthers) {
    constexpr size_t kChunk = CommitAhead::kChunk;
    const size_t bytes = 10 * kChunk + 1000;  // the last chunk ends inside a page
    SmallPages buf(bytes);
    ASSERT_NE(buf.p, nullptr);
#ifndef MADV_POPULATE_WRITE
    constexpr int MADV_POPULATE_WRITE = 23;
#endif
    if (::madvise(buf.p + 9 * kChunk, 4096, MADV_POPULATE_WRITE) != 0 && errno == EINVAL) {
        GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14): writes fault their pages in";
    }
    CommitAhead commit(bytes);
    // Eight bytes inside chunk 2: all of chunk 2 is resident, before anything is written.
    commit.before_write(buf.p, 2 * kChunk + 5000, 8);
    EXPECT_TRUE(resident(buf.p + 2 * kChunk));
    EXPECT_TRUE(resident(buf.p + 3 * kChunk - 1));
    EXPECT_FALSE(resident(buf.p + 3 * kChunk));
    EXPECT_FALSE(resident(buf.p + 2 * kChunk - 1));
    EXPECT_FALSE(resident(buf.p));
    // A write across a chunk boundary commits both chunks; the last, partial chunk up to the buffer's end.
    commit.before_write(buf.p, 5 * kChunk - 4, 8);
    EXPECT_TRUE(resident(buf.p + 4 * kChunk));
    EXPECT_TRUE(resident(buf.p + 6 * kChunk - 1));
    EXPECT_FALSE(resident(buf.p + 6 * kChunk));
    commit.before_write(buf.p, bytes - 1, 1);
    EXPECT_TRUE(resident(buf.p + bytes - 1));
    EXPECT_TRUE(resident(buf.p + 10 * kChunk));
    // Populating writes nothing: the memory still reads as zero, and holds what is written.
    size_t nonzero = 0;
    for (size_t i = 2 * kChunk; i < 3 * kChunk; ++i) nonzero += buf.p[i] != 0;
    EXPECT_EQ(nonzero, 0u);
    buf.p[2 * kChunk + 5000] = 9;
    EXPECT_EQ(buf.p[2 * kChunk + 5000], 9);
    // A write of nothing commits nothing.
    commit.before_write(buf.p, 7 * kChunk, 0);
    EXPECT_FALSE(resident(buf.p + 7 * kChunk));
}

TEST(CommitAhead, ABufferOffAPageBoundaryCommitsTheWholePagesItTouches) {
    // A buffer 1000 bytes into a mapping (as calloc's may share its first and last pages with other memory): a
    // write to its first bytes commits the page below its start, one to its last bytes the page holding its end;
    // the memory around it keeps what it holds, and the buffer reads zero.
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t bytes = 3 * CommitAhead::kChunk + 100;
    SmallPages map(bytes + 4 * page);
    ASSERT_NE(map.p, nullptr);
    uint8_t *buf = map.p + 1000;
#ifndef MADV_POPULATE_WRITE
    constexpr int MADV_POPULATE_WRITE = 23;
#endif
    if (::madvise(map.p + 3 * page, page, MADV_POPULATE_WRITE) != 0 && errno == EINVAL) {
        GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14): writes fault their pages in";
    }
    std::memset(map.p, 0x5A, 1000);  // the neighbour before the buffer (its first page becomes resident)
    CommitAhead commit(bytes);
    commit.before_write(buf, bytes - 1, 1);
    EXPECT_TRUE(resident(buf + bytes - 1));
    EXPECT_FALSE(resident(buf + CommitAhead::kChunk * 2));  // chunk 2 of the buffer: not touched
    EXPECT_FALSE(resident(buf + bytes + 2 * page));         // beyond the buffer's last page
    // Chunk 1 starts inside a page (1000 bytes off): that page is committed from its start.
    ASSERT_FALSE(resident(buf + CommitAhead::kChunk));
    commit.before_write(buf, CommitAhead::kChunk, 1);
    EXPECT_TRUE(resident(buf + CommitAhead::kChunk));
    commit.before_write(buf, 0, 8);
    EXPECT_TRUE(resident(buf + CommitAhead::kChunk - 1));  // all of chunk 0
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(map.p[i], 0x5A) << i;
    for (size_t i = 0; i < CommitAhead::kChunk; ++i) ASSERT_EQ(buf[i], 0) << i;
}

}  // namespace
}  // namespace sparrow
