// Structured fuzzing of the model loader and the forward pass behind it.
//
// gguf_fuzz_test.cpp damages the bytes of a file, which the GGUF reader rejects long before a model is built.
// Here the damage is done one level up, to files that parse: tiny valid models of every architecture are
// rewritten with their metadata set to boundary values, to the wrong type, cut short or removed, and their
// tensors removed, reshaped, retyped or filled with NaN. Each result is loaded and, when it loads, runs a
// prompt through the tokenizer and a few decode steps with the selection active. Every outcome must be a
// model that runs (its logits may be anything: the weights may be NaN) or a sparrow::Error; any other
// exception is a failure here, and a crash, a hang (the CTest timeout) or a sanitizer report in the ASan
// build is one too. A huge allocation driven by a metadata value counts as a failure (std::bad_alloc):
// the loader must check sizes against the tensors before it allocates.
//
// SPARROW_FUZZ_ITERATIONS and SPARROW_FUZZ_SEED set the iterations per seed model and the seed for longer
// runs by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "model/synthetic.h"
#include "runtime/tokenizer.h"
#include "sparrow/sparrow.h"
#include "test_util.h"

namespace sparrow {
namespace {

using gguf::Value;
using gguf::ValueType;

using test::env_or;

#if defined(__SANITIZE_ADDRESS__)
constexpr uint64_t kDefaultIterations = 60;  // per seed model; the sanitizer build is ~10x slower
#else
constexpr uint64_t kDefaultIterations = 250;
#endif

struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
};

// A model file as editable parts: metadata in file order and tensors with their bytes.
struct Draft {
    std::vector<std::pair<std::string, Value>> kv;
    std::vector<Tensor> tensors;
};

Draft draft_of(const gguf::File &f) {
    Draft d;
    d.kv = f.metadata();
    for (const auto &t : f.tensors())
        d.tensors.push_back({t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.n_bytes)});
    return d;
}

int64_t n_rows(const std::vector<int64_t> &ne) {
    int64_t r = 1;
    for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
    return r;
}

// Small random values in `type`, for a tensor whose shape or type changed.
std::vector<uint8_t> random_data(std::mt19937 &rng, DType type, const std::vector<int64_t> &ne) {
    const int64_t row_bytes = dtype_row_size(type, ne[0]);
    std::vector<uint8_t> data(static_cast<size_t>(row_bytes * n_rows(ne)));
    for (int64_t r = 0; r < n_rows(ne); ++r) {
        const std::vector<float> x = test::random_floats(rng, static_cast<size_t>(ne[0]), -0.5f, 0.5f);
        quantize_row(type, x.data(), data.data() + r * row_bytes, ne[0]);
    }
    return data;
}

bool is_block_type(DType t) { return dtype_is_quantized(t); }

// An integer for a field of the given type: boundary values, small values, and the old value nudged. The
// result always fits `type` (the writer refuses values out of range, and so would the reader).
Value fuzz_integer(std::mt19937 &rng, const Value &old) {
    const bool is_signed = std::holds_alternative<int64_t>(old.data);
    const int64_t v = is_signed ? std::get<int64_t>(old.data) : static_cast<int64_t>(std::get<uint64_t>(old.data));
    // The old value nudged, saturating (an earlier mutation may have left it at an int64 extreme).
    auto nudged = [](__int128 x) {
        return static_cast<int64_t>(
            std::clamp<__int128>(x, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    };
    const int64_t picks[] = {0,
                             1,
                             2,
                             3,
                             -1,
                             7,
                             31,
                             33,
                             64,
                             65,
                             int64_t(1) << 20,
                             int64_t(1) << 31,
                             (int64_t(1) << 31) - 1,
                             (int64_t(1) << 32) - 1,
                             int64_t(1) << 40,
                             std::numeric_limits<int64_t>::max(),
                             std::numeric_limits<int64_t>::min(),
                             nudged(__int128(v) + 1),
                             nudged(__int128(v) - 1),
                             nudged(__int128(v) * 2),
                             v / 2,
                             nudged(-__int128(v))};
    int64_t x = picks[std::uniform_int_distribution<size_t>(0, std::size(picks) - 1)(rng)];
    // Keep the field's own type when the value fits it, else widen to the 64-bit type of the same sign
    // (a file may legitimately store any integer type; the loader reads them all).
    auto fits = [&](ValueType t) {
        switch (t) {
            case ValueType::UINT8: return x >= 0 && x <= 0xff;
            case ValueType::INT8: return x >= -128 && x <= 127;
            case ValueType::UINT16: return x >= 0 && x <= 0xffff;
            case ValueType::INT16: return x >= -32768 && x <= 32767;
            case ValueType::UINT32: return x >= 0 && x <= 0xffffffffLL;
            case ValueType::INT32: return x >= INT32_MIN && x <= INT32_MAX;
            case ValueType::UINT64: return x >= 0;
            default: return true;
        }
    };
    if (fits(old.type)) {
        return is_signed ? Value{old.type, x} : Value{old.type, static_cast<uint64_t>(x)};
    }
    return x >= 0 ? Value::u64(static_cast<uint64_t>(x)) : Value::i64(x);
}

Value fuzz_float(std::mt19937 &rng, const Value &old) {
    const double v = std::get<double>(old.data);
    const double picks[] = {0.0,      -1.0,      1.0, 0.5,   1e30,  -1e30, 1e-30,  std::nan(""),
                            INFINITY, -INFINITY, -v,  v * 2, v / 2, 1e-45, 65536.0};
    const double x = picks[std::uniform_int_distribution<size_t>(0, std::size(picks) - 1)(rng)];
    return old.type == ValueType::FLOAT32 ? Value::f32(static_cast<float>(x)) : Value::f64(x);
}

Value fuzz_string(std::mt19937 &rng) {
    const char *picks[] = {"", "llama", "deepseek32", "glm-dsa", "gpt2", "no_vocab", "x", "\xff\xfe", "yarn", "none"};
    return Value::str(picks[std::uniform_int_distribution<size_t>(0, std::size(picks) - 1)(rng)]);
}

// A boundary value of the same kind as a scalar `old` (integer, float, string or bool).
Value fuzz_scalar(std::mt19937 &rng, const Value &old) {
    if (old.is_integer()) return fuzz_integer(rng, old);
    if (old.type == ValueType::FLOAT32 || old.type == ValueType::FLOAT64) return fuzz_float(rng, old);
    if (old.type == ValueType::STRING) return fuzz_string(rng);
    if (old.type == ValueType::BOOL) return Value::boolean(!std::get<bool>(old.data));
    return old;
}

// A value of another type than `old` (a string where a number is expected, a number where an array is...).
Value wrong_type(std::mt19937 &rng, const Value &old) {
    switch (std::uniform_int_distribution<int>(0, 4)(rng)) {
        case 0: return old.type == ValueType::STRING ? Value::u32(7) : Value::str("7");
        case 1: return Value::f32(2.5f);
        case 2: return Value::boolean(true);
        case 3: return Value::array(ValueType::INT32, {Value::i32(1), Value::i32(2)});
        default: return old.type == ValueType::ARRAY ? Value::u8(1) : Value::array(ValueType::STRING, {});
    }
}

Value fuzz_array(std::mt19937 &rng, const Value &old) {
    gguf::Array a = std::get<gguf::Array>(old.data);
    switch (std::uniform_int_distribution<int>(0, 4)(rng)) {
        case 0:  // cut short (often to nothing)
            a.items.resize(a.items.empty() ? 0 : std::uniform_int_distribution<size_t>(0, a.items.size() - 1)(rng));
            break;
        case 1:  // one longer
            if (!a.items.empty()) a.items.push_back(a.items.back());
            break;
        case 2:  // one element at a boundary value
            if (!a.items.empty() && a.type != ValueType::ARRAY) {
                Value &e = a.items[std::uniform_int_distribution<size_t>(0, a.items.size() - 1)(rng)];
                e = fuzz_scalar(rng, e);
                if (e.is_integer()) {
                    a.type = e.type;  // a widened value widens the whole array's type
                    for (auto &other : a.items) {
                        if (other.type != e.type) other = Value{e.type, other.data};
                    }
                }
            }
            break;
        case 3:  // elements of another type
        {
            std::vector<Value> items(a.items.size(), Value::str("1"));
            return Value::array(ValueType::STRING, std::move(items));
        }
        default: {
            std::vector<Value> items(a.items.size(), Value::i32(-1));
            return Value::array(ValueType::INT32, std::move(items));
        }
    }
    // Integers converted between signed and unsigned storage must keep the variant the type implies.
    for (auto &e : a.items) {
        if (e.is_integer() && std::holds_alternative<uint64_t>(e.data) &&
            (a.type == ValueType::INT8 || a.type == ValueType::INT16 || a.type == ValueType::INT32 ||
             a.type == ValueType::INT64)) {
            e = Value{a.type, static_cast<int64_t>(std::get<uint64_t>(e.data))};
        }
    }
    return Value{ValueType::ARRAY, std::move(a)};
}

// One random change to the draft; returns what it did, for the failure message.
std::string mutate(std::mt19937 &rng, Draft &d) {
    const int what = std::uniform_int_distribution<int>(0, 9)(rng);
    if (what < 6 && !d.kv.empty()) {  // metadata
        const size_t i = std::uniform_int_distribution<size_t>(0, d.kv.size() - 1)(rng);
        auto &[key, v] = d.kv[i];
        if (key == "general.alignment") return "kept general.alignment";  // the writer's layout, not the model's
        const int how = std::uniform_int_distribution<int>(0, 9)(rng);
        if (how == 0) {
            const std::string k = key;
            d.kv.erase(d.kv.begin() + static_cast<std::ptrdiff_t>(i));
            return "removed " + k;
        }
        if (how == 1) {
            v = wrong_type(rng, v);
        } else if (v.type == ValueType::ARRAY) {
            v = fuzz_array(rng, v);
        } else {
            v = fuzz_scalar(rng, v);
        }
        return key + " = " + v.to_display_string(4);
    }
    if (d.tensors.empty()) return "no tensors";
    const size_t i = std::uniform_int_distribution<size_t>(0, d.tensors.size() - 1)(rng);
    Tensor &t = d.tensors[i];
    const std::string name = t.name;
    switch (std::uniform_int_distribution<int>(0, 5)(rng)) {
        case 0: d.tensors.erase(d.tensors.begin() + static_cast<std::ptrdiff_t>(i)); return "removed tensor " + name;
        case 1: {  // one dimension changed
            const size_t k = std::uniform_int_distribution<size_t>(0, t.ne.size() - 1)(rng);
            const int64_t picks[] = {t.ne[k] + 1, std::max<int64_t>(1, t.ne[k] - 1), t.ne[k] * 2, 1, 32};
            t.ne[k] = picks[std::uniform_int_distribution<size_t>(0, std::size(picks) - 1)(rng)];
            break;
        }
        case 2:  // dimensions swapped, one added or one dropped
            if (t.ne.size() >= 2 && std::uniform_int_distribution<int>(0, 1)(rng)) {
                std::swap(t.ne[0], t.ne[1]);
            } else if (t.ne.size() < 4 && std::uniform_int_distribution<int>(0, 1)(rng)) {
                t.ne.push_back(2);
            } else if (t.ne.size() > 1) {
                t.ne.pop_back();
            }
            break;
        case 3: {  // another element type
            const DType types[] = {DType::F32,  DType::F16,  DType::BF16,   DType::Q8_0,  DType::Q4_0, DType::Q4_1,
                                   DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::MXFP4, DType::Q2_K, DType::Q3_K,
                                   DType::Q4_K, DType::Q5_K, DType::Q6_K,   DType::IQ4_XS};
            t.type = types[std::uniform_int_distribution<size_t>(0, std::size(types) - 1)(rng)];
            break;
        }
        case 4:  // NaN weights (f32 tensors)
            if (t.type == DType::F32) {
                auto *f = reinterpret_cast<float *>(t.data.data());
                for (size_t j = 0; j < t.data.size() / 4; j += 3) f[j] = std::nanf("");
                return "NaN in " + name;
            }
            return "kept " + name;
        default:  // renamed (a tensor the model does not know, and one it misses)
            t.name += ".x";
            return "renamed " + name;
    }
    // Not representable otherwise: rows must hold whole blocks.
    if (is_block_type(t.type) && t.ne[0] % dtype_info(t.type).block_size != 0) t.type = DType::F32;
    t.data = random_data(rng, t.type, t.ne);
    std::string shape;
    for (int64_t n : t.ne) {
        if (!shape.empty()) shape += ',';
        shape += std::to_string(n);
    }
    return "tensor " + name + " -> " + std::string(dtype_name(t.type)) + " [" + shape + "]";
}

// Loads the file and runs it: a tokenized prompt in one batch, then two single tokens; top-k 4 so that the
// DSA models select. Returns "ran" or "refused: " and the message of the sparrow::Error (which starts with the
// file's path when loading refused it), else what went wrong.
std::string load_and_run(const std::string &path) {
    try {
        ModelParams mp;
        mp.repack = true;
        std::shared_ptr<const Model> model;
        try {
            model = load_model(path, mp);
        } catch (const Error &e) {
            if (!std::string(e.what()).starts_with(path))
                return "a load error that does not name the file: " + std::string(e.what());
            throw;
        }
        ContextParams cp;
        cp.n_ctx = 32;
        cp.n_ubatch = 4;
        cp.n_threads = 1;
        cp.dsa_top_k = 4;
        Context ctx(model, cp);
        const int64_t n_vocab = ctx.n_vocab();
        std::vector<int32_t> ids = model_tokenizer(*model).encode("Once upon a time, a bird <s> sang.", true, true);
        ids.resize(std::min<size_t>(ids.size(), 12));
        if (ids.empty()) ids = {0, 1, 2};
        std::vector<BatchToken> batch;
        for (size_t j = 0; j < ids.size(); ++j) {
            batch.push_back({static_cast<int32_t>(ids[j] % n_vocab), static_cast<int32_t>(j), 0, j + 1 == ids.size()});
        }
        ctx.decode(batch);
        for (int step = 0; step < 2; ++step) {
            const std::span<const float> logits = ctx.logits(step == 0 ? ids.size() - 1 : 0);
            if (static_cast<int64_t>(logits.size()) != n_vocab) return "logits of the wrong size";
            int32_t best = 0;
            for (int64_t v = 1; v < n_vocab; ++v)
                best = logits[static_cast<size_t>(v)] > logits[best] ? int32_t(v) : best;
            (void)model_tokenizer(*model).token_to_piece(best);
            const BatchToken next{best, static_cast<int32_t>(ids.size()) + step, 0, true};
            ctx.decode(std::span<const BatchToken>(&next, 1));
        }
        return "ran";
    } catch (const Error &e) {
        return std::string(e.what()).empty() ? "a sparrow::Error without a message"
                                             : "refused: " + std::string(e.what());
    } catch (const std::exception &e) {
        return std::string("exception other than sparrow::Error: ") + e.what();
    }
}

struct Seed {
    std::string label;
    SyntheticParams params;
};

std::vector<Seed> seeds() {
    std::vector<Seed> s;
    s.push_back({"llama", synthetic_defaults("llama")});
    s.push_back({"deepseek32", synthetic_defaults("deepseek32")});
    SyntheticParams ds_q8 = synthetic_defaults("deepseek32");
    ds_q8.type = DType::Q8_0;
    ds_q8.yarn = true;
    ds_q8.n_nextn = 1;
    s.push_back({"deepseek32 q8_0 yarn mtp", ds_q8});
    SyntheticParams llama_k = synthetic_defaults("llama");
    llama_k.type = DType::Q4_K;
    llama_k.n_embd = 256;  // rows of whole super-blocks (the narrower matrices fall back to q8_0)
    s.push_back({"llama q4_k", llama_k});
    SyntheticParams glm = synthetic_defaults("glm-dsa");
    glm.n_layer = 3;
    glm.indexer_types = {1, 0, 1};
    s.push_back({"glm-dsa", glm});
    for (auto &seed : s) seed.params.n_layer = std::min<int64_t>(seed.params.n_layer, 3);
    return s;
}

TEST(ModelFuzz, DamagedModelsLoadAndRunOrAreRefusedCleanly) {
    const uint64_t iterations = env_or("SPARROW_FUZZ_ITERATIONS", kDefaultIterations);
    const uint64_t seed = env_or("SPARROW_FUZZ_SEED", 20261130);
    const std::string dir = test::make_temp_dir("model_fuzz");
    const std::string path = dir + "/fuzzed.gguf";
    std::map<std::string, int> outcomes;  // ran / refused / unwritable
    int failures = 0;
    for (const Seed &s : seeds()) {
        const std::string seed_path = dir + "/seed.gguf";
        write_synthetic_model(s.params, seed_path);
        ASSERT_EQ(load_and_run(seed_path), "ran") << s.label << ": the undamaged model must run";
        const gguf::File original = gguf::File::open(seed_path);
        std::mt19937 rng(static_cast<uint32_t>(seed + std::hash<std::string>{}(s.label)));
        for (uint64_t it = 0; it < iterations; ++it) {
            Draft d = draft_of(original);
            std::string what;
            const int n_mutations = std::uniform_int_distribution<int>(1, 3)(rng);
            for (int m = 0; m < n_mutations; ++m) {
                if (!what.empty()) what += "; ";
                what += mutate(rng, d);
            }
            gguf::Writer w;
            try {
                for (const auto &[k, v] : d.kv) w.set(k, v);
                for (const auto &t : d.tensors) w.add_tensor(t.name, t.type, t.ne, t.data.data(), t.data.size());
                w.write(path);
            } catch (const Error &) {
                ++outcomes["unwritable"];  // e.g. a tensor renamed onto another's name
                continue;
            }
            const std::string result = load_and_run(path);
            if (result == "ran" || result.starts_with("refused: ")) {
                ++outcomes[result.substr(0, 7)];
            } else {
                ADD_FAILURE() << s.label << " iteration " << it << " (" << what << "): " << result;
                if (++failures >= 20) return;
            }
            std::filesystem::remove(path);
        }
    }
    std::filesystem::remove_all(dir);
    // Both outcomes must be common, or the mutations are too mild (everything runs) or too crude
    // (everything fails at the first check).
    EXPECT_GT(outcomes["ran"], static_cast<int>(iterations / 10)) << "damaged models that still ran";
    EXPECT_GT(outcomes["refused"], static_cast<int>(iterations / 10)) << "damaged models that were refused";
}

// Values the type checks let through but the forward pass cannot use: each is refused at load with the key
// named (the fuzzer above found them loading and giving NaN or silently clamped logits).
TEST(ModelFuzz, UnusableHyperParametersAreRefusedWithTheKeyNamed) {
    struct Case {
        std::string arch, key;
        Value value;
    };
    const double nan = std::nan("");
    const std::vector<Case> cases = {
        {"llama", "llama.rope.freq_base", Value::f32(static_cast<float>(nan))},
        {"llama", "llama.rope.freq_base", Value::f32(-10000.0f)},
        {"llama", "llama.attention.layer_norm_rms_epsilon", Value::f32(INFINITY)},
        {"llama", "llama.attention.layer_norm_rms_epsilon", Value::f32(-1e-5f)},
        {"llama", "llama.rope.scaling.factor", Value::f32(-2.0f)},
        {"deepseek32", "deepseek32.rope.freq_base", Value::f32(static_cast<float>(nan))},
        {"deepseek32", "deepseek32.rope.freq_base", Value::f32(0.0f)},
        {"deepseek32", "deepseek32.attention.layer_norm_rms_epsilon", Value::f32(INFINITY)},
        {"deepseek32", "deepseek32.expert_weights_scale", Value::f32(-INFINITY)},
        {"deepseek32", "deepseek32.expert_weights_scale", Value::f32(-2.5f)},
        {"deepseek32", "deepseek32.expert_group_used_count", Value::i32(-1)},
        {"deepseek32", "deepseek32.expert_group_count", Value::i32(-4)},
        // The file has shared-expert tensors; 0 (as when the key is absent) would drop that expert.
        {"deepseek32", "deepseek32.expert_shared_count", Value::u32(0)},
        {"deepseek32", "deepseek32.rope.scaling.factor", Value::f32(static_cast<float>(nan))},
        {"deepseek32", "deepseek32.rope.scaling.yarn_log_multiplier", Value::f32(INFINITY)},
        {"deepseek32", "deepseek32.rope.scaling.attn_factor", Value::f32(0.0f)},
        {"deepseek32", "deepseek32.rope.scaling.original_context_length", Value::u64(uint64_t(1) << 40)},
        {"glm-dsa", "glm-dsa.rope.freq_base", Value::f64(INFINITY)},
        {"glm-dsa", "glm-dsa.attention.layer_norm_rms_epsilon", Value::f32(static_cast<float>(nan))},
        // Integers written as bools: not read as 0 / 1 (block_count true would be a one-layer model).
        {"llama", "llama.block_count", Value::boolean(true)},
        {"deepseek32", "deepseek32.expert_used_count", Value::boolean(true)},
    };
    const std::string dir = test::make_temp_dir("model_hparams");
    std::map<std::string, std::string> seed_paths;
    for (const std::string arch : {"llama", "deepseek32", "glm-dsa"}) {
        SyntheticParams p = synthetic_defaults(arch);
        if (arch == "deepseek32") p.yarn = true;  // so that the YaRN keys are read
        seed_paths[arch] = dir + "/" + arch + ".gguf";
        write_synthetic_model(p, seed_paths[arch]);
    }
    for (const Case &c : cases) {
        const gguf::File original = gguf::File::open(seed_paths[c.arch]);
        gguf::Writer w = gguf::Writer::from_file(original);
        w.set(c.key, c.value);
        const std::string path = dir + "/bad.gguf";
        w.write(path);
        try {
            load_model(path);
            ADD_FAILURE() << c.key << " = " << c.value.to_display_string() << " loaded";
        } catch (const Error &e) {
            EXPECT_NE(std::string(e.what()).find(c.key), std::string::npos) << e.what();
        }
    }
    std::filesystem::remove_all(dir);
}

// The last position's logits of a fixed 24-token prompt (positions far enough apart for a RoPE scale to show).
std::vector<float> prompt_logits(const std::string &path) {
    ContextParams cp;
    cp.n_ctx = 64;
    cp.n_threads = 1;
    Context ctx(load_model(path), cp);
    std::vector<BatchToken> batch;
    for (int32_t j = 0; j < 24; ++j)
        batch.push_back({(7 * j + 3) % static_cast<int32_t>(ctx.n_vocab()), j, 0, j == 23});
    ctx.decode(batch);
    const std::span<const float> logits = ctx.logits(23);
    return {logits.begin(), logits.end()};
}

TEST(ModelFuzz, DsaRopeScalingTypeDefaultsToLinearAsLlamaCppReadsIt) {
    // llama.cpp reads an absent rope.scaling.type as "linear" and the factor from rope.scaling.factor, else from the
    // old rope.scale_linear: a file with a factor and no type runs with positions scaled by 1 / factor. "none" ignores
    // the factor (tests/reference/dsa_ref.py reads them the same way).
    const std::string dir = test::make_temp_dir("rope_default");
    const std::string seed = dir + "/seed.gguf";
    write_synthetic_model(synthetic_defaults("deepseek32"), seed);  // no rope.scaling keys at all
    const gguf::File original = gguf::File::open(seed);
    const auto variant = [&](const std::string &name, const std::vector<std::pair<std::string, Value>> &keys) {
        gguf::Writer w = gguf::Writer::from_file(original);
        for (const auto &[k, v] : keys) w.set(k, v);
        const std::string path = dir + "/" + name + ".gguf";
        w.write(path);
        return prompt_logits(path);
    };
    const std::vector<float> plain = prompt_logits(seed);
    const std::vector<float> no_type = variant("no_type", {{"deepseek32.rope.scaling.factor", Value::f32(4.0f)}});
    const std::vector<float> linear = variant("linear", {{"deepseek32.rope.scaling.factor", Value::f32(4.0f)},
                                                         {"deepseek32.rope.scaling.type", Value::str("linear")}});
    const std::vector<float> old_key = variant("old_key", {{"deepseek32.rope.scale_linear", Value::f32(4.0f)}});
    const std::vector<float> none = variant("none", {{"deepseek32.rope.scaling.factor", Value::f32(4.0f)},
                                                     {"deepseek32.rope.scaling.type", Value::str("none")}});
    EXPECT_EQ(no_type, linear);
    EXPECT_EQ(old_key, linear);
    EXPECT_EQ(none, plain);
    EXPECT_NE(linear, plain) << "a position scale of 1/4 left the logits unchanged: the test proves nothing";
    std::filesystem::remove_all(dir);
}

TEST(ModelFuzz, WeightTypesSparrowCannotComputeWithAreRefusedByName) {
    // The IQ types other than IQ4_NL and IQ4_XS, TQ1_0, and Q8_K, are valid GGUF that sparrow has no kernels for: the
    // load names the tensor and its type (and the K-quants, IQ4_XS and MXFP4, which it does support, load).
    const std::string dir = test::make_temp_dir("model_types");
    SyntheticParams p = synthetic_defaults("llama");
    p.n_embd = 256;
    const std::string seed_path = dir + "/llama.gguf";
    write_synthetic_model(p, seed_path);
    const gguf::File original = gguf::File::open(seed_path);
    for (const DType t : {DType::IQ4_XS, DType::IQ2_XXS, DType::IQ3_S, DType::TQ1_0, DType::Q8_K, DType::Q2_K,
                          DType::Q4_K, DType::MXFP4}) {
        Draft d = draft_of(original);
        for (Tensor &tensor : d.tensors) {
            if (tensor.name != "blk.0.ffn_up.weight") continue;
            tensor.type = t;
            tensor.data.assign(static_cast<size_t>(dtype_row_size(t, tensor.ne[0]) * n_rows(tensor.ne)), 0);
        }
        gguf::Writer w;
        for (const auto &[k, v] : d.kv) w.set(k, v);
        for (const auto &tensor : d.tensors) {
            w.add_tensor(tensor.name, tensor.type, tensor.ne, tensor.data.data(), tensor.data.size());
        }
        const std::string path = dir + "/typed.gguf";
        w.write(path);
        if (dtype_is_supported(t)) {
            EXPECT_NO_THROW(load_model(path));
            continue;
        }
        try {
            load_model(path);
            ADD_FAILURE() << dtype_name(t) << " loaded";
        } catch (const Error &e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find("blk.0.ffn_up.weight"), std::string::npos) << msg;
            EXPECT_NE(msg.find(std::string(dtype_name(t))), std::string::npos) << msg;
        }
    }
    std::filesystem::remove_all(dir);
}

// A tensor no architecture reads would be part of another model (llama.cpp's optional attention biases, a mistyped
// name): the load refuses the file naming it, where sparrow used to run without it. What an architecture leaves
// unread on purpose still loads: MTP/NextN layers, attn_kv_b beside attn_k_b/v_b, indexer tensors on a layer
// marked as sharing.
TEST(ModelFuzz, TensorsNoArchitectureReadsAreRefusedByName) {
    const std::string dir = test::make_temp_dir("model_unread");
    // path of `p`'s file with `edit` applied to its tensors
    const auto variant = [&](const SyntheticParams &p, const std::string &name, auto &&edit) {
        const std::string seed = dir + "/seed.gguf";
        write_synthetic_model(p, seed);
        Draft d = draft_of(gguf::File::open(seed));
        edit(d.tensors);
        gguf::Writer w;
        for (const auto &[k, v] : d.kv) w.set(k, v);
        for (const auto &t : d.tensors) w.add_tensor(t.name, t.type, t.ne, t.data.data(), t.data.size());
        const std::string path = dir + "/" + name + ".gguf";
        w.write(path);
        return path;
    };
    const auto refusal = [](const std::string &path) -> std::string {
        try {
            load_model(path);
        } catch (const Error &e) {
            return e.what();
        }
        return "";
    };
    const auto copy_as = [](std::vector<Tensor> &ts, const std::string &from, const std::string &to) {
        for (size_t i = 0, n = ts.size(); i < n; ++i) {
            if (ts[i].name != from) continue;
            Tensor t = ts[i];
            t.name = to;
            ts.push_back(t);
            return;
        }
        FAIL() << from << " is not in the file";
    };

    const SyntheticParams llama = synthetic_defaults("llama");
    {  // llama.cpp's LLM_ARCH_LLAMA reads optional q/k/v/o biases; sparrow's llama has none
        const std::string path = variant(llama, "llama_bias", [&](std::vector<Tensor> &ts) {
            copy_as(ts, "blk.0.attn_norm.weight", "blk.0.attn_q.bias");
        });
        const std::string msg = refusal(path);
        EXPECT_NE(msg.find("1 tensor that a llama model does not have (blk.0.attn_q.bias)"), std::string::npos) << msg;
        EXPECT_NE(msg.find("sparrow would compute without it"), std::string::npos) << msg;
        EXPECT_TRUE(msg.starts_with(path)) << msg;
    }
    {  // many: the first four named, the rest counted
        const std::string path = variant(llama, "llama_biases", [&](std::vector<Tensor> &ts) {
            for (int il = 0; il < 2; ++il) {
                const std::string b = "blk." + std::to_string(il) + ".";
                for (const char *x : {"attn_q", "attn_k", "attn_v"})
                    copy_as(ts, b + "attn_norm.weight", b + x + ".bias");
            }
        });
        const std::string msg = refusal(path);
        EXPECT_NE(msg.find("6 tensors that a llama model does not have (blk.0.attn_q.bias, blk.0.attn_k.bias, "
                           "blk.0.attn_v.bias, blk.1.attn_q.bias and 2 more)"),
                  std::string::npos)
            << msg;
    }
    SyntheticParams glm = synthetic_defaults("glm-dsa");
    glm.n_layer = 3;
    glm.indexer_types = {1, 0, 1};
    {  // IndexShare: layer 1 reuses layer 0's selection whatever it holds (llama.cpp ignores indexer tensors there
       // too); a tensor no indexer has is still refused
        const std::string path = variant(glm, "glm_shared_indexer", [&](std::vector<Tensor> &ts) {
            copy_as(ts, "blk.0.indexer.proj.weight", "blk.1.indexer.proj.weight");
            copy_as(ts, "blk.0.indexer.k_norm.bias", "blk.1.indexer.k_norm.bias");
        });
        EXPECT_EQ(refusal(path), "");
        const std::string odd = refusal(variant(glm, "glm_odd", [&](std::vector<Tensor> &ts) {
            copy_as(ts, "blk.0.indexer.proj.weight", "blk.1.attn_q_a.bias");
        }));
        EXPECT_NE(odd.find("(blk.1.attn_q_a.bias)"), std::string::npos) << odd;
    }
    SyntheticParams ds = synthetic_defaults("deepseek32");
    ds.n_layer = 2;
    ds.n_nextn = 1;  // blk.2 is an MTP layer: loaded by nobody, and no reason to refuse
    {
        const std::string path = variant(ds, "ds_mtp", [](std::vector<Tensor> &) {});
        EXPECT_EQ(refusal(path), "");
        // a layer past block_count is nobody's, MTP or not
        const std::string stray = refusal(variant(ds, "ds_stray", [&](std::vector<Tensor> &ts) {
            copy_as(ts, "blk.2.attn_norm.weight", "blk.3.attn_norm.weight");
        }));
        EXPECT_NE(stray.find("(blk.3.attn_norm.weight)"), std::string::npos) << stray;
        for (const char *odd : {"blk.-1.attn_norm.weight", "blk.1x.attn_norm.weight", "blk.2", "blk..attn_norm"}) {
            const std::string msg = refusal(variant(
                ds, "ds_odd_name", [&](std::vector<Tensor> &ts) { copy_as(ts, "blk.2.attn_norm.weight", odd); }));
            EXPECT_NE(msg.find(std::string("(") + odd + ")"), std::string::npos) << msg;
        }
    }
    {  // the combined kv_b beside its split form is left unread; alone it is refused by load_layer's own message
        const int64_t kv_rows = ds.n_head * (ds.head_nope + ds.head_v);
        const auto kv_b = [&](std::vector<Tensor> &ts) {
            Tensor t{"blk.0.attn_kv_b.weight", DType::F32, {ds.kv_lora_rank, kv_rows}, {}};
            t.data.assign(static_cast<size_t>(4 * ds.kv_lora_rank * kv_rows), 0);
            ts.push_back(t);
        };
        EXPECT_EQ(refusal(variant(ds, "ds_kv_b", kv_b)), "");
        const std::string alone = refusal(variant(ds, "ds_kv_b_alone", [&](std::vector<Tensor> &ts) {
            kv_b(ts);
            std::erase_if(ts, [](const Tensor &t) { return t.name.starts_with("blk.0.attn_k_b"); });
        }));
        EXPECT_NE(alone.find("old combined attn_kv_b"), std::string::npos) << alone;
        const std::string unknown = refusal(variant(
            ds, "ds_unknown", [&](std::vector<Tensor> &ts) { copy_as(ts, "output_norm.weight", "output_norm.bias"); }));
        EXPECT_NE(unknown.find("a deepseek32 model does not have (output_norm.bias)"), std::string::npos) << unknown;
    }
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sparrow
