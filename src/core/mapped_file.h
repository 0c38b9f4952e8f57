// A read-only memory mapping of a whole file (RAII). Model weights are used in place from the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sparrow {

class MappedFile {
  public:
    MappedFile() = default;
    explicit MappedFile(const std::string &path);  // throws sparrow::Error naming the path and the reason
    ~MappedFile();
    MappedFile(MappedFile &&other) noexcept;
    MappedFile &operator=(MappedFile &&other) noexcept;
    MappedFile(const MappedFile &) = delete;
    MappedFile &operator=(const MappedFile &) = delete;

    const uint8_t *data() const { return data_; }
    size_t size() const { return size_; }
    const std::string &path() const { return path_; }

  private:
    void release();

    std::string path_;
    const uint8_t *data_ = nullptr;
    size_t size_ = 0;
};

// Drops the whole pages inside [p, p + n) of a read-only file mapping from this process's memory (the file
// is unchanged, and a later read maps the pages in again): for mapped bytes that were copied elsewhere.
void release_mapped_pages(const void *p, size_t n);

}  // namespace sparrow
