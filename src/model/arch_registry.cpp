#include <array>

#include "core/error.h"
#include "model/arch.h"

namespace sparrow {

namespace {
struct ArchEntry {
    const char *name;
    std::unique_ptr<ArchModel> (*create)(const gguf::File &, WeightLoader &, ModelInfo &);
};
constexpr std::array<ArchEntry, 3> kArchitectures = {{
    {"llama", create_llama},
    {"deepseek32", create_dsa},
    {"glm-dsa", create_dsa},
}};
}  // namespace

std::unique_ptr<ArchModel> create_arch_model(const gguf::File &file, WeightLoader &weights, ModelInfo &info) {
    const std::string arch = file.get_string("general.architecture");
    for (const auto &entry : kArchitectures) {
        if (arch == entry.name) return entry.create(file, weights, info);
    }
    std::string known;
    for (const auto &entry : kArchitectures) known += (known.empty() ? "" : ", ") + std::string(entry.name);
    throw_error("%s: architecture '%s' is not supported (sparrow runs: %s)", file.name().c_str(), arch.c_str(),
                known.c_str());
}

}  // namespace sparrow
