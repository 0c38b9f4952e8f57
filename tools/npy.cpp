#include "npy.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace sparrow::tools {

void write_npy_f32(const std::string &path, std::span<const float> data, const std::vector<int64_t> &shape) {
    std::string dims;
    for (int64_t d : shape) dims += std::to_string(d) + ",";
    if (shape.size() > 1) dims.pop_back();  // "(5,)" for one dimension, "(2,3)" for more
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
    // magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64, ending in
    // \n.
    const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
    header.append(total - 10 - header.size() - 1, ' ');
    header += '\n';
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) throw_error("cannot create '%s': %s", path.c_str(), std::strerror(errno));
    const uint16_t header_len = static_cast<uint16_t>(header.size());
    bool ok = std::fwrite("\x93NUMPY\x01\x00", 1, 8, f) == 8;
    ok = ok && std::fwrite(&header_len, 2, 1, f) == 1;
    ok = ok && std::fwrite(header.data(), 1, header.size(), f) == header.size();
    ok = ok && std::fwrite(data.data(), sizeof(float), data.size(), f) == data.size();
    ok = (std::fclose(f) == 0) && ok;
    if (!ok) throw_error("cannot write '%s'", path.c_str());
}

}  // namespace sparrow::tools
