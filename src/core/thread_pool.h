// One explicit pool of worker threads. The calling thread takes part, so a pool of 1 runs everything inline.
// Ops split their rows with parallel_for; nothing else in sparrow starts threads for compute.
//
// A job's thread indices are claimed, not assigned: whichever threads are running take them, the caller
// included, so a worker the OS has not scheduled yet (another process on the core, a vCPU just woken) never
// holds up a job: the caller runs its share and returns. run() waits only for indices already claimed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sparrow {

class ThreadPool {
  public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int n_threads() const { return n_threads_; }
    // The hardware threads of this machine (at least 1): the default pool size.
    static int hardware_threads();

    // Calls fn(ith, nth) once for each ith in [0, nth), nth = n_threads(), on whichever pool threads claim them
    // (one thread may run several), and returns when all are done.
    void run(const std::function<void(int ith, int nth)> &fn);

    // Calls fn(begin, end) over [0, n) in chunks of `grain` items handed out dynamically (an atomic
    // counter), so uneven rows balance. Runs inline when n <= grain or the pool has one thread.
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)> &fn);
    // The same, telling fn which thread runs the chunk (0 <= ith < n_threads(); 0 when run inline), for callers
    // that keep per-thread buffers.
    void parallel_for_threads(int64_t n, int64_t grain,
                              const std::function<void(int ith, int64_t begin, int64_t end)> &fn);

  private:
    void worker_loop();
    // Claims and runs the current job's indices until none is left; returns the generation found exhausted.
    uint64_t run_claims();

    int n_threads_;
    std::vector<std::thread> workers_;
    // The job: its generation (bumped once per run()) in the high 32 bits, the next unclaimed index in the low
    // 32 (n_threads_ or more: nothing left). One word, so that a claim can only succeed in the generation whose
    // job_ it then runs.
    std::atomic<uint64_t> claims_;
    std::atomic<const std::function<void(int, int)> *> job_{nullptr};  // valid while a run() is in flight
    std::atomic<int> completed_{0};                                    // indices of this generation done
    // Sleepers, so that the busy path never takes the mutex: run() notifies only when a worker sleeps, a
    // worker only when the caller sleeps (each side stores, then loads the other's flag, all seq_cst).
    std::atomic<int> n_sleeping_{0};
    std::atomic<bool> caller_sleeping_{false};
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable done_cv_;
};

}  // namespace sparrow
