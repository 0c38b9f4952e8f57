// Memory for big, long-lived buffers that are written once (the weights repacked at load): one anonymous
// mapping, reserved up front and handed out in order, that asks the kernel for transparent huge pages.
//
// Why: the first write to fresh memory costs a page fault per page, and with 4 KiB pages those faults, not the
// packing, were most of a load (a profile of the bench model's: 71% of the packing's samples on the first store
// into a page; its 850 MB are ~217K such pages). With 2 MiB pages there are 512x fewer faults. One mapping for all
// the matrices, rather than one per matrix, rounds up to a huge page once instead of per matrix (sessions 5 and
// 9 measured 52 MiB more resident memory on the bench model with a huge-page mapping per matrix).
//
// Address space only is reserved (MAP_NORESERVE): pages become resident when written, so a reservation larger
// than what is used costs nothing. Where the kernel has no transparent huge pages the advice fails silently and
// the pages are ordinary ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace sparrow {

class PageArena {
  public:
    static constexpr size_t kAlignment = 64;  // of every allocation (a cache line; the kernels' vector loads)

    PageArena() = default;
    // Reserves `capacity` bytes; throws sparrow::Error when the address space cannot be had.
    explicit PageArena(size_t capacity);
    ~PageArena();
    PageArena(PageArena &&other) noexcept;
    PageArena &operator=(PageArena &&other) noexcept;
    PageArena(const PageArena &) = delete;
    PageArena &operator=(const PageArena &) = delete;

    // n bytes (uninitialised, kAlignment-aligned) after the previous allocation; throws sparrow::Error when
    // they do not fit in what is left of the capacity.
    uint8_t *allocate(size_t n);
    size_t capacity() const { return capacity_; }
    size_t used() const { return used_; }

  private:
    void release();

    uint8_t *base_ = nullptr;  // the mapping (from a 2 MiB boundary): capacity_ bytes from here
    size_t capacity_ = 0;
    size_t used_ = 0;
};

// Zeroed memory for big buffers that fill gradually (the cache's rows): from 2 MiB up, an anonymous mapping from a
// 2 MiB boundary that asks for transparent huge pages, which is zero without being written, so that a cache for a
// long context costs no zeroing pass at creation and becomes resident as its rows are written; below that, calloc.
// The mapping ends at the buffer's last 4 KiB page, not at a whole huge page: its last part (less than 2 MiB) is in
// ordinary pages, so a filled buffer is resident to its size. Rounding each of a context's stores up to whole huge
// pages held 42 MiB more on the bench model at 16K (24 stores; +4% of its weights and caches, over issue 3's 10%
// bound); ordinary pages throughout made the attention kernel at 65536 take 1.6-2.2x as long (the 2048 rows it
// gathers per layer from 75 MB stores each missed the TLB). Session 27 measured both.
// free_zeroed takes the size given to allocate_zeroed.
void *allocate_zeroed(size_t bytes);
void free_zeroed(void *p, size_t bytes);

// Commits the pages of a buffer from allocate_zeroed ahead of its writes, kChunk bytes at a time, with one
// madvise(MADV_POPULATE_WRITE) instead of a page fault per 4 KiB page. A fault costs a trap into the kernel per
// page, which a virtual machine makes dear: on the 2-vCPU VM (a paravirtualised guest) a first write to a fresh
// page took ~10 us, and populating 256 KiB at a time ~0.8 us a page. A cache writes a new row per layer and
// token (decode with four sequences took ~16 faults a step, ~1.5% of it; a 32-token prompt ~100). Memory stays
// committed as it is written, up to one chunk ahead. Where the kernel lacks MADV_POPULATE_WRITE (before Linux
// 5.14) the first refusal turns it off and pages fault in as before. One writer at a time, as the buffer's.
class CommitAhead {
  public:
    static constexpr size_t kChunk = size_t(64) << 10;

    CommitAhead() = default;
    explicit CommitAhead(size_t bytes) : bytes_(bytes), done_((bytes + kChunk - 1) / kChunk, 0) {}
    // Before writing bytes [offset, offset + n) of the buffer (of the size given above) that starts at base.
    void before_write(void *base, size_t offset, size_t n) {
        if (n == 0 || off_) return;
        const size_t first = offset / kChunk, last = (offset + n - 1) / kChunk;
        if (done_[first] && done_[last]) return;
        commit(static_cast<uint8_t *>(base), first, last);
    }

  private:
    void commit(uint8_t *base, size_t first, size_t last);
    size_t bytes_ = 0;
    std::vector<uint8_t> done_;  // per chunk: committed (or given up on)
    bool off_ = false;           // the kernel refused: leave every page to its fault
};

// An allocator for std::vector on allocate_zeroed. Its construct() without arguments does nothing: the memory is
// zero already, so value-initialising arithmetic elements writes nothing. Meant for vectors sized once, at
// construction (vector(n)): growing one within its capacity after shrinking it would not zero the re-used
// elements, and assign / resize with a value write every element as usual.
template <typename T>
struct ZeroedAllocator {
    using value_type = T;
    ZeroedAllocator() = default;
    template <typename U>
    ZeroedAllocator(const ZeroedAllocator<U> &) noexcept {}  // implicit on purpose: rebinding, as allocators do
    T *allocate(size_t n) { return static_cast<T *>(allocate_zeroed(n * sizeof(T))); }
    void deallocate(T *p, size_t n) noexcept { free_zeroed(p, n * sizeof(T)); }
    template <typename U>
    void construct(U *) noexcept {
        static_assert(std::is_arithmetic_v<U>, "zero bytes are the value-initialised value of arithmetic types only");
    }
    template <typename U, typename... Args>
    void construct(U *p, Args &&...args) {
        ::new (static_cast<void *>(p)) U(std::forward<Args>(args)...);
    }
    template <typename U>
    bool operator==(const ZeroedAllocator<U> &) const noexcept {
        return true;
    }
};

template <typename T>
using ZeroedVector = std::vector<T, ZeroedAllocator<T>>;

}  // namespace sparrow
