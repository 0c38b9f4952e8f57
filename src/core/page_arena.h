// Memory for big, long-lived buffers that are written once (the weights repacked at load): one anonymous
// mapping, reserved up front and handed out in order, that asks the kernel for transparent huge pages.
//
// Why: the first write to fresh memory costs a page fault per page, and with 4 KiB pages that fault, not the
// packing, was most of a load (850 MB of bench-preset weights: 217K faults). With 2 MiB pages there are 512x
// fewer, and the weights that decode streams every token need fewer TLB entries. One mapping for all the
// matrices, rather than one per matrix, rounds up to a huge page once instead of per matrix (52 MiB on the
// bench model when each matrix had its own).
//
// Address space only is reserved (MAP_NORESERVE): pages become resident when written, so a reservation larger
// than what is used costs nothing. Where the kernel has no transparent huge pages the advice fails silently and
// the pages are ordinary ones.
#pragma once

#include <cstddef>
#include <cstdint>

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
    // Whether the kernel took the huge-page advice (false where it has no transparent huge pages).
    bool huge_pages() const { return huge_pages_; }

  private:
    void release();

    uint8_t *mapping_ = nullptr;  // what mmap returned: mapped_bytes_ of it
    size_t mapped_bytes_ = 0;
    uint8_t *base_ = nullptr;  // the first 2 MiB boundary in the mapping: capacity_ bytes from here
    size_t capacity_ = 0;
    size_t used_ = 0;
    bool huge_pages_ = false;
};

}  // namespace sparrow
