"""Peak memory of a DSA prefill must not grow with the ubatch size or the number of indexer heads beyond
the per-token state that has to exist (the residual stream, n_embd floats per token, and each token's
selection list, top-k cells): the attention part of a layer (latent-space queries, attention outputs,
indexer queries, the indexer's top-k buffers) runs in fixed-size query chunks.

Measured with `sparrow bench`'s peak resident memory on a small model whose per-token attention scratch
is large (16 heads x 272-wide latent queries, 128 indexer heads): without the chunking, going from
-ub 256 to -ub 2048 adds ~75 MiB, and 8 -> 128 indexer heads ~32 MiB; the bounds below allow a few MiB.
Named _slow so that the sanitizer pass leaves it out: AddressSanitizer's shadow memory and quarantine make
resident memory say nothing about the program's own allocations."""
import os
import re

import harness

checks = harness.Checks()
tmp = harness.temp_dir()
N_PROMPT, SMALL_UB, LARGE_UB = 2048, 256, 2048
N_EMBD, TOP_K = 64, 64
SLACK_MIB = 6.0  # allocator and page-granularity noise

COMMON = ["--arch", "deepseek32", "--n-embd", N_EMBD, "--n-layer", 2, "--n-head", 16, "--kv-lora-rank", 256,
          "--q-lora-rank", 64, "--indexer-head-dim", 32, "--top-k", TOP_K, "--n-vocab", 512]


def make(name, heads):
    path = os.path.join(tmp, name)
    harness.run(["make-model"] + COMMON + ["--indexer-heads", heads, "-o", path])
    return path


def peak_above_weights(model, ubatch):
    """bench's peak resident memory minus the mapped weights, MiB."""
    proc = harness.run(["bench", "-m", model, "-p", N_PROMPT, "-n", 0, "-d", 0, "-r", 1, "-t", 2,
                        "--ubatch-size", ubatch])
    m = re.search(r"peak resident memory ([0-9.]+) MiB \(weights ([0-9.]+) MiB", proc.stderr)
    if not m:
        raise AssertionError(f"no peak memory line in bench's output:\n{proc.stderr}")
    return float(m.group(1)) - float(m.group(2))


few_heads, many_heads = make("h8.gguf", 8), make("h128.gguf", 128)
small = peak_above_weights(few_heads, SMALL_UB)
large = peak_above_weights(few_heads, LARGE_UB)
large_heads = peak_above_weights(many_heads, LARGE_UB)

# Per token that must exist for the whole ubatch: the residual stream (f32), the selection (int32 cells and
# a span), the visible-row span, and batch metadata: well under 1 KiB here.
per_token = N_EMBD * 4 + TOP_K * 4 + 16 + 16 + 64
allowed = (LARGE_UB - SMALL_UB) * per_token / 2**20 + SLACK_MIB
checks.check(large - small <= allowed,
             f"-ub {LARGE_UB} vs {SMALL_UB}: peak above weights grows {large - small:.1f} MiB "
             f"(allowed {allowed:.1f}: {per_token} bytes per token + {SLACK_MIB} MiB)")
checks.check(large_heads - large <= SLACK_MIB,
             f"128 vs 8 indexer heads at -ub {LARGE_UB}: peak above weights grows {large_heads - large:.1f} MiB "
             f"(allowed {SLACK_MIB})")
checks.finish()
