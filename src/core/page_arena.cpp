#include "core/page_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "core/error.h"

namespace sparrow {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;  // x86-64's transparent huge page
constexpr size_t kPage = 4096;                 // an ordinary page

size_t round_up(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

// round_up(bytes, granule) bytes (granule: kHugePage or kPage) of fresh zero memory from a 2 MiB boundary,
// address space only until written, advised to use transparent huge pages (ordinary pages where refused); null
// with errno set when the address space cannot be had. One huge page more is mapped, and the unaligned head and
// the tail given back. The kernel backs a 2 MiB range with a huge page only when the whole range lies inside the
// mapping, so with granule kPage the part past the last whole 2 MiB stays in ordinary pages: memory filled to its
// end is resident to the byte, not rounded up to the next 2 MiB.
void *map_huge_pages(size_t bytes, size_t granule) {
    if (bytes > SIZE_MAX - 2 * kHugePage) {
        errno = ENOMEM;
        return nullptr;
    }
    const size_t len = round_up(bytes, granule);
    void *raw =
        ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const auto begin = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (begin + kHugePage - 1) / kHugePage * kHugePage, end = begin + len + kHugePage;
    if (aligned > begin) ::munmap(raw, aligned - begin);
    if (end > aligned + len) ::munmap(reinterpret_cast<void *>(aligned + len), end - (aligned + len));
    ::madvise(reinterpret_cast<void *>(aligned), len, MADV_HUGEPAGE);
    return reinterpret_cast<void *>(aligned);
}

void unmap_huge_pages(void *p, size_t bytes, size_t granule) { ::munmap(p, round_up(bytes, granule)); }

}  // namespace

PageArena::PageArena(size_t capacity) {
    if (capacity == 0) return;
    void *p = map_huge_pages(capacity, kHugePage);
    if (!p) throw_error("page arena: cannot reserve %zu bytes: %s", capacity, std::strerror(errno));
    base_ = static_cast<uint8_t *>(p);
    capacity_ = capacity;
}

PageArena::~PageArena() { release(); }

PageArena::PageArena(PageArena &&other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      used_(std::exchange(other.used_, 0)) {}

PageArena &PageArena::operator=(PageArena &&other) noexcept {
    if (this != &other) {
        release();
        base_ = std::exchange(other.base_, nullptr);
        capacity_ = std::exchange(other.capacity_, 0);
        used_ = std::exchange(other.used_, 0);
    }
    return *this;
}

uint8_t *PageArena::allocate(size_t n) {
    const size_t start = (used_ + kAlignment - 1) / kAlignment * kAlignment;
    if (start > capacity_ || n > capacity_ - start) {
        throw_error("page arena: %zu bytes asked with %zu of %zu left", n, capacity_ - std::min(start, capacity_),
                    capacity_);
    }
    used_ = start + n;
    return base_ + start;
}

void PageArena::release() {
    if (base_) unmap_huge_pages(base_, capacity_, kHugePage);
    base_ = nullptr;
    capacity_ = used_ = 0;
}

void *allocate_zeroed(size_t bytes) {
    void *p = bytes < kHugePage ? std::calloc(bytes > 0 ? bytes : 1, 1) : map_huge_pages(bytes, kPage);
    if (!p) throw std::bad_alloc();
    return p;
}

void free_zeroed(void *p, size_t bytes) {
    if (!p) return;
    if (bytes < kHugePage) {
        std::free(p);
    } else {
        unmap_huge_pages(p, bytes, kPage);
    }
}

void CommitAhead::commit(uint8_t *base, size_t first, size_t last) {
#ifndef MADV_POPULATE_WRITE
    constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14's value, for older headers
#endif
    for (size_t c = first; c <= last; ++c) {
        if (done_[c]) continue;
        done_[c] = 1;
        // The chunk's whole pages: the rounding stays inside pages that hold bytes of the buffer (a calloc'ed one
        // may share its first and last page with other memory, which populating leaves as it is).
        const auto lo = reinterpret_cast<uintptr_t>(base + c * kChunk) / kPage * kPage;
        const auto hi = round_up(reinterpret_cast<uintptr_t>(base + std::min(bytes_, (c + 1) * kChunk)), kPage);
        if (::madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_POPULATE_WRITE) != 0 &&
            (errno == EINVAL || errno == ENOSYS || errno == EPERM)) {
            off_ = true;  // not this kernel's: writes fault their pages in
            return;
        }
    }
}

}  // namespace sparrow
