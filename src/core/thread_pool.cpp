#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace sparrow {

namespace {
// Workers spin this long on the generation counter before sleeping (and the caller as long on the workers'
// completion): decode runs hundreds of parallel sections per token with serial work between them (norms,
// the indexer's merge, sampling) that can take 100-200 us. A worker that has gone to sleep costs a futex
// wake-up, and on a virtual machine an idle vCPU is halted: waking it was measured at 0.7-1.5 ms on the
// 2-core EPYC VM, against ~1 ms of work in the section (the indexer at 16K keys ran 1.2x faster on 2
// threads than on 1 with a 67 us spin, 1.9x with 670 us). A time budget, not a count of pause
// instructions, because pause takes ~3 ns on some CPUs and ~35-140 ns on others. Bounded, so that an
// oversubscribed machine loses at most this much of a time slice per section.
constexpr std::chrono::microseconds kSpinTime{500};
constexpr int kPausesPerClockRead = 16;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// Spins (pause) until done() or kSpinTime has passed; returns done().
template <typename Done>
bool spin_until(const Done &done) {
    const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
    while (!done()) {
        for (int i = 0; i < kPausesPerClockRead; ++i) cpu_relax();
        if (std::chrono::steady_clock::now() > deadline) return done();
    }
    return true;
}
}  // namespace

int ThreadPool::hardware_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

namespace {
constexpr uint64_t kIndexMask = 0xffffffffu;
inline uint64_t generation_of(uint64_t claims) { return claims >> 32; }
// A generation with no index left to claim.
inline uint64_t exhausted(uint64_t gen, int n_threads) { return (gen << 32) | static_cast<uint64_t>(n_threads); }
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)), claims_(exhausted(0, n_threads_)) {
    workers_.reserve(static_cast<size_t>(n_threads_ - 1));
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true, std::memory_order_seq_cst);
    claims_.store(exhausted(generation_of(claims_.load(std::memory_order_relaxed)) + 1, n_threads_),
                  std::memory_order_seq_cst);
    { std::lock_guard<std::mutex> lock(mutex_); }
    wake_.notify_all();
    for (auto &t : workers_) t.join();
}

uint64_t ThreadPool::run_claims() {
    uint64_t claims = claims_.load(std::memory_order_acquire);
    for (;;) {
        const uint64_t ith = claims & kIndexMask;
        if (ith >= static_cast<uint64_t>(n_threads_)) return generation_of(claims);
        if (!claims_.compare_exchange_weak(claims, claims + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
            continue;  // another thread claimed first (claims now holds the new state)
        }
        // The claim succeeded in this generation, whose job stays in place until all its indices are done.
        (*job_.load(std::memory_order_relaxed))(static_cast<int>(ith), n_threads_);
        if (completed_.fetch_add(1, std::memory_order_seq_cst) + 1 == n_threads_ &&
            caller_sleeping_.load(std::memory_order_seq_cst)) {
            std::lock_guard<std::mutex> lock(mutex_);
            done_cv_.notify_one();
        }
        claims = claims_.load(std::memory_order_acquire);
    }
}

void ThreadPool::worker_loop() {
    uint64_t seen = 0;  // the generation whose indices this worker last found all claimed
    auto has_news = [&] {
        return generation_of(claims_.load(std::memory_order_seq_cst)) != seen || stop_.load(std::memory_order_seq_cst);
    };
    for (;;) {
        if (!spin_until(has_news)) {
            std::unique_lock<std::mutex> lock(mutex_);
            n_sleeping_.fetch_add(1, std::memory_order_seq_cst);
            wake_.wait(lock, has_news);
            n_sleeping_.fetch_sub(1, std::memory_order_seq_cst);
        }
        if (stop_.load(std::memory_order_acquire)) return;
        seen = run_claims();
    }
}

void ThreadPool::run(const std::function<void(int, int)> &fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    job_.store(&fn, std::memory_order_relaxed);
    completed_.store(0, std::memory_order_relaxed);
    const uint64_t gen = generation_of(claims_.load(std::memory_order_relaxed)) + 1;
    claims_.store(gen << 32, std::memory_order_seq_cst);  // publishes job_ and completed_ with the generation
    if (n_sleeping_.load(std::memory_order_seq_cst) > 0) {
        { std::lock_guard<std::mutex> lock(mutex_); }
        wake_.notify_all();
    }
    run_claims();
    // Every index is claimed now; wait for those still running on workers.
    auto done = [&] { return completed_.load(std::memory_order_seq_cst) == n_threads_; };
    if (!spin_until(done)) {
        std::unique_lock<std::mutex> lock(mutex_);
        caller_sleeping_.store(true, std::memory_order_seq_cst);
        done_cv_.wait(lock, done);
        caller_sleeping_.store(false, std::memory_order_relaxed);
    }
    job_.store(nullptr, std::memory_order_relaxed);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &fn) {
    parallel_for_threads(n, grain, [&fn](int, int64_t begin, int64_t end) { fn(begin, end); });
}

void ThreadPool::parallel_for_threads(int64_t n, int64_t grain, const std::function<void(int, int64_t, int64_t)> &fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    if (n_threads_ == 1 || n <= grain) {
        fn(0, 0, n);
        return;
    }
    // The job's state sits behind one reference so the lambda fits std::function's inline storage:
    // parallel_for runs many times per token and must not allocate.
    struct Chunks {
        std::atomic<int64_t> next{0};
        int64_t n, grain;
        const std::function<void(int, int64_t, int64_t)> *fn;
    } chunks{{}, n, grain, &fn};
    run([&chunks](int ith, int) {
        for (;;) {
            const int64_t begin = chunks.next.fetch_add(chunks.grain, std::memory_order_relaxed);
            if (begin >= chunks.n) break;
            (*chunks.fn)(ith, begin, std::min(chunks.n, begin + chunks.grain));
        }
    });
}

}  // namespace sparrow
