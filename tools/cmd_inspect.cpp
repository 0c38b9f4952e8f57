// `sparrow inspect FILE.gguf`: the header, every metadata key with its type and value, and the tensor table.
#include <cstdio>

#include "commands.h"
#include "gguf/gguf.h"

namespace sparrow::tools {

Command register_inspect(CLI::App &app) {
    auto *cmd = app.add_subcommand("inspect", "Print a GGUF file's metadata and tensor table");
    auto path = std::make_shared<std::string>();
    auto max_items = std::make_shared<size_t>(8);
    cmd->add_option("file", *path, "GGUF file")->required();
    cmd->add_option("--array-items", *max_items, "Array elements shown per key");
    return [path, max_items] {
        const gguf::File f = gguf::File::open(*path);
        std::printf("file: %s\nGGUF version %u, %zu bytes, alignment %llu, data at offset %llu\n", path->c_str(),
                    f.version(), f.size_bytes(), (unsigned long long)f.alignment(),
                    (unsigned long long)f.data_offset());
        std::printf("\nmetadata (%zu keys):\n", f.metadata().size());
        for (const auto &[key, value] : f.metadata()) {
            std::printf("  %-48s %-4s %s\n", key.c_str(), gguf::value_type_name(value.type),
                        value.to_display_string(*max_items).c_str());
        }
        int64_t total = 0;
        std::printf("\ntensors (%zu):\n  %-48s %-8s %-28s %14s\n", f.tensors().size(), "name", "type", "shape",
                    "bytes");
        for (const auto &t : f.tensors()) {
            std::printf("  %-48s %-8s %-28s %14lld\n", t.name.c_str(), std::string(dtype_name(t.type)).c_str(),
                        t.shape_string().c_str(), (long long)t.n_bytes);
            total += t.n_bytes;
        }
        std::printf("  total %lld bytes of tensor data\n", (long long)total);
        return 0;
    };
}

}  // namespace sparrow::tools
