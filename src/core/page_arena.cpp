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

size_t whole_huge_pages(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }

// whole_huge_pages(bytes) of fresh zero memory from a 2 MiB boundary (huge pages only back aligned 2 MiB ranges),
// address space only until written, advised to use transparent huge pages (ordinary pages where refused); null
// with errno set when the address space cannot be had. One page more is mapped, and the unaligned head and the
// tail given back.
void *map_huge_pages(size_t bytes) {
    if (bytes > SIZE_MAX - 2 * kHugePage) {
        errno = ENOMEM;
        return nullptr;
    }
    const size_t len = whole_huge_pages(bytes);
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

void unmap_huge_pages(void *p, size_t bytes) { ::munmap(p, whole_huge_pages(bytes)); }

// Fresh zero memory in ordinary 4 KiB pages, address space only until written; null with errno set when it cannot
// be had. (mmap and munmap round the length to whole pages themselves.) Huge pages are refused even where the
// system gives them unasked (THP "always"), so that resident memory follows the rows written on every machine.
void *map_zero_pages(size_t bytes) {
    void *p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    ::madvise(p, bytes, MADV_NOHUGEPAGE);
    return p;
}

}  // namespace

PageArena::PageArena(size_t capacity) {
    if (capacity == 0) return;
    void *p = map_huge_pages(capacity);
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
    if (base_) unmap_huge_pages(base_, capacity_);
    base_ = nullptr;
    capacity_ = used_ = 0;
}

void *allocate_zeroed(size_t bytes) {
    void *p = bytes < kHugePage ? std::calloc(bytes > 0 ? bytes : 1, 1) : map_zero_pages(bytes);
    if (!p) throw std::bad_alloc();
    return p;
}

void free_zeroed(void *p, size_t bytes) {
    if (!p) return;
    if (bytes < kHugePage) {
        std::free(p);
    } else {
        ::munmap(p, bytes);
    }
}

}  // namespace sparrow
