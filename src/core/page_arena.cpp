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
}

PageArena::PageArena(size_t capacity) : capacity_(capacity) {
    if (capacity == 0) return;
    if (capacity > SIZE_MAX - 2 * kHugePage) throw_error("page arena: %zu bytes cannot be reserved", capacity);
    // One huge page more than asked, so that the usable range can start on a 2 MiB boundary (huge pages only
    // back aligned 2 MiB ranges), and the end rounded up to whole huge pages.
    mapped_bytes_ = (capacity + 2 * kHugePage - 1) / kHugePage * kHugePage;
    void *p =
        ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        const int err = errno;
        mapped_bytes_ = 0;
        throw_error("page arena: cannot reserve %zu bytes: %s", capacity, std::strerror(err));
    }
    mapping_ = static_cast<uint8_t *>(p);
    const auto addr = reinterpret_cast<uintptr_t>(mapping_);
    base_ = reinterpret_cast<uint8_t *>((addr + kHugePage - 1) / kHugePage * kHugePage);
    const size_t usable = mapped_bytes_ - static_cast<size_t>(base_ - mapping_);
    huge_pages_ = ::madvise(base_, usable / kHugePage * kHugePage, MADV_HUGEPAGE) == 0;
}

PageArena::~PageArena() { release(); }

PageArena::PageArena(PageArena &&other) noexcept
    : mapping_(std::exchange(other.mapping_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      base_(std::exchange(other.base_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      used_(std::exchange(other.used_, 0)),
      huge_pages_(std::exchange(other.huge_pages_, false)) {}

PageArena &PageArena::operator=(PageArena &&other) noexcept {
    if (this != &other) {
        release();
        mapping_ = std::exchange(other.mapping_, nullptr);
        mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
        base_ = std::exchange(other.base_, nullptr);
        capacity_ = std::exchange(other.capacity_, 0);
        used_ = std::exchange(other.used_, 0);
        huge_pages_ = std::exchange(other.huge_pages_, false);
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

void *allocate_zeroed(size_t bytes) {
    if (bytes < kHugePage) {
        void *p = std::calloc(bytes > 0 ? bytes : 1, 1);
        if (!p) throw std::bad_alloc();
        return p;
    }
    if (bytes > SIZE_MAX - 2 * kHugePage) throw std::bad_alloc();
    // Whole huge pages from a 2 MiB boundary: map one more, then give back the unaligned head and the tail.
    const size_t len = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void *raw =
        ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const auto begin = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (begin + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > begin) ::munmap(raw, aligned - begin);
    const uintptr_t end = begin + len + kHugePage;
    if (end > aligned + len) ::munmap(reinterpret_cast<void *>(aligned + len), end - (aligned + len));
    ::madvise(reinterpret_cast<void *>(aligned), len, MADV_HUGEPAGE);  // advice: ordinary pages if refused
    return reinterpret_cast<void *>(aligned);
}

void free_zeroed(void *p, size_t bytes) {
    if (!p) return;
    if (bytes < kHugePage) {
        std::free(p);
        return;
    }
    ::munmap(p, (bytes + kHugePage - 1) / kHugePage * kHugePage);
}

void PageArena::release() {
    if (mapping_) ::munmap(mapping_, mapped_bytes_);
    mapping_ = base_ = nullptr;
    mapped_bytes_ = capacity_ = used_ = 0;
    huge_pages_ = false;
}

}  // namespace sparrow
