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

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    workers_.reserve(static_cast<size_t>(n_threads_ - 1));
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
        generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto &t : workers_) t.join();
}

void ThreadPool::worker_loop(int ith) {
    uint64_t seen = 0;
    for (;;) {
        uint64_t gen = seen;
        spin_until([&] { return (gen = generation_.load(std::memory_order_acquire)) != seen; });
        if (gen == seen) {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
            gen = generation_.load(std::memory_order_acquire);
        }
        seen = gen;
        const std::function<void(int, int)> *job;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (stop_) return;
            job = job_;
        }
        (*job)(ith, n_threads_);
        if (n_pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            std::lock_guard<std::mutex> lock(mutex_);
            done_cv_.notify_one();
        }
    }
}

void ThreadPool::run(const std::function<void(int, int)> &fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        job_ = &fn;
        n_pending_.store(n_threads_ - 1, std::memory_order_release);
        generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    fn(0, n_threads_);
    if (!spin_until([&] { return n_pending_.load(std::memory_order_acquire) == 0; })) {
        std::unique_lock<std::mutex> lock(mutex_);
        done_cv_.wait(lock, [&] { return n_pending_.load(std::memory_order_acquire) == 0; });
    }
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = nullptr;
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
