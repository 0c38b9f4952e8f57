// One explicit pool of worker threads. The calling thread takes part as thread 0, so a pool of 1 runs
// everything inline. Ops split their rows with parallel_for; nothing else in sparrow starts threads for
// compute.
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

    // Runs fn(ith, nth) once on each of the nth threads and returns when all are done.
    void run(const std::function<void(int ith, int nth)> &fn);

    // Calls fn(begin, end) over [0, n) in chunks of `grain` items handed out dynamically (an atomic
    // counter), so uneven rows balance. Runs inline when n <= grain or the pool has one thread.
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)> &fn);
    // The same, telling fn which thread runs the chunk (0 <= ith < n_threads(); 0 when run inline), for callers
    // that keep per-thread buffers.
    void parallel_for_threads(int64_t n, int64_t grain,
                              const std::function<void(int ith, int64_t begin, int64_t end)> &fn);

  private:
    void worker_loop(int ith);

    int n_threads_;
    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable done_cv_;
    const std::function<void(int, int)> *job_ = nullptr;  // valid while a run() is in flight
    std::atomic<uint64_t> generation_{0};                 // bumped once per run()
    std::atomic<int> n_pending_{0};                       // workers still busy with this generation
    bool stop_ = false;
};

}  // namespace sparrow
