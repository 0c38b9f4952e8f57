// The thread pool: run() calls every index once, parallel_for covers each index exactly once whatever the
// sizes, both survive many back-to-back jobs (the spin path) and jobs after idle pauses (the sleep path), and a
// worker that is not running (frozen here by a signal handler while it sleeps) does not hold up a job.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <future>
#include <string>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace sparrow {
namespace {

// A SIGUSR1 handler that parks the thread it interrupts until released: a worker the OS does not run.
// Signal handlers can only reach statics; these are touched by this one test.
std::atomic<bool> g_parked{false};
std::atomic<bool> g_release{false};
void park_thread(int) {
    g_parked.store(true);
    while (!g_release.load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

// The scheduler state of one of this process's threads ('R' running, 'S' asleep in a system call, ...), from
// /proc/self/task/TID/stat, whose state field follows the ')' that ends the thread's name.
char thread_state(long tid) {
    std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
    std::string stat;
    std::getline(f, stat);
    const size_t close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
}

TEST(ThreadPool, RunCallsEveryThreadOnce) {
    for (int n_threads : {1, 2, 3, 8}) {
        ThreadPool pool(n_threads);
        EXPECT_EQ(pool.n_threads(), n_threads);
        std::vector<std::atomic<int>> calls(static_cast<size_t>(n_threads));
        std::atomic<int> bad_nth{0};
        pool.run([&](int ith, int nth) {
            if (nth != n_threads) bad_nth.fetch_add(1);
            calls[static_cast<size_t>(ith)].fetch_add(1);
        });
        EXPECT_EQ(bad_nth.load(), 0);
        for (int i = 0; i < n_threads; ++i) EXPECT_EQ(calls[static_cast<size_t>(i)].load(), 1) << "thread " << i;
    }
}

TEST(ThreadPool, AtLeastOneThread) {
    ThreadPool pool(0);
    EXPECT_EQ(pool.n_threads(), 1);
    int calls = 0;
    pool.run([&](int ith, int nth) { calls += (ith == 0 && nth == 1); });
    EXPECT_EQ(calls, 1);
}

TEST(ThreadPool, RunOnOneThreadIsInline) {
    ThreadPool pool(1);
    std::thread::id seen;
    pool.run([&](int, int) { seen = std::this_thread::get_id(); });
    EXPECT_EQ(seen, std::this_thread::get_id());
}

TEST(ThreadPool, ParallelForCoversEachIndexExactlyOnce) {
    for (int n_threads : {1, 2, 3, 5}) {
        ThreadPool pool(n_threads);
        for (int64_t n : {0, 1, 2, 7, 31, 64, 100, 4097}) {
            for (int64_t grain : {0, 1, 3, 16, 64, 10000}) {
                std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
                std::atomic<int> bad_chunks{0};
                pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
                    // Chunks are at most `grain` long, except the whole range run inline on one thread.
                    const bool whole = begin == 0 && end == n && (n_threads == 1 || n <= grain);
                    if (begin < 0 || end > n || begin >= end || (end - begin > std::max<int64_t>(1, grain) && !whole)) {
                        bad_chunks.fetch_add(1);
                    }
                    for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
                });
                EXPECT_EQ(bad_chunks.load(), 0) << "n=" << n << " grain=" << grain;
                for (int64_t i = 0; i < n; ++i) {
                    ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
                        << "threads=" << n_threads << " n=" << n << " grain=" << grain << " i=" << i;
                }
            }
        }
    }
}

TEST(ThreadPool, ParallelForRunsInlineWhenOneChunk) {
    ThreadPool pool(4);
    std::set<std::thread::id> ids;
    pool.parallel_for(10, 10, [&](int64_t, int64_t) { ids.insert(std::this_thread::get_id()); });
    ASSERT_EQ(ids.size(), 1u);
    EXPECT_EQ(*ids.begin(), std::this_thread::get_id());
}

TEST(ThreadPool, ParallelForUsesSeveralThreads) {
    // With chunks that take a while, the workers (not just the caller) must pick some up.
    ThreadPool pool(2);
    std::mutex m;
    std::set<std::thread::id> ids;
    pool.parallel_for(64, 1, [&](int64_t, int64_t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::lock_guard<std::mutex> lock(m);
        ids.insert(std::this_thread::get_id());
    });
    EXPECT_EQ(ids.size(), 2u);
}

TEST(ThreadPool, ManyBackToBackJobsAndJobsAfterSleep) {
    // Two threads: more threads than cores makes every job wait out a spinning thread's time slice.
    ThreadPool pool(2);
    std::atomic<int64_t> total{0};
    for (int job = 0; job < 3000; ++job) {
        pool.parallel_for(12, 1, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
    }
    EXPECT_EQ(total.load(), 3000 * 12);
    // Long enough idle for the workers to stop spinning and wait on the condition variable.
    for (int job = 0; job < 3; ++job) {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        pool.parallel_for(12, 1, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
    }
    EXPECT_EQ(total.load(), 3000 * 12 + 3 * 12);
}

TEST(ThreadPool, ResultsVisibleToTheCaller) {
    // Writes made by workers inside a job are visible to the caller once run() returns.
    ThreadPool pool(4);
    std::vector<int64_t> out(1000, 0);
    for (int round = 1; round <= 50; ++round) {
        pool.parallel_for(1000, 7, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) out[static_cast<size_t>(i)] = i * round;
        });
        for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], i * round);
    }
}

TEST(ThreadPool, RunDoesNotWaitForAWorkerThatIsNotRunning) {
    ThreadPool pool(2);
    // Find the worker thread: with each index taking a while, the worker claims one of them.
    const pthread_t caller = pthread_self();
    pthread_t worker{};
    long worker_tid = 0;
    bool found = false;
    for (int attempt = 0; attempt < 200 && !found; ++attempt) {
        std::mutex m;
        pool.run([&](int, int) {
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            std::lock_guard<std::mutex> lock(m);
            if (!pthread_equal(pthread_self(), caller)) {
                worker = pthread_self();
                worker_tid = syscall(SYS_gettid);
                found = true;
            }
        });
    }
    ASSERT_TRUE(found) << "the worker never took part in a job";
    // Park it once it sleeps on its condition variable: asleep in the futex wait, which it entered after
    // releasing the pool's mutex (nothing else holds that mutex now, so the wait is not for the mutex). Parked
    // while it still held the mutex (between taking it and waiting), it would block run()'s wake-up.
    int asleep = 0;
    for (int i = 0; i < 5000 && asleep < 5; ++i) {
        asleep = thread_state(worker_tid) == 'S' ? asleep + 1 : 0;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(asleep, 5) << "the worker did not go to sleep (state " << thread_state(worker_tid) << ")";
    struct sigaction action {};
    struct sigaction previous {};
    action.sa_handler = park_thread;
    sigemptyset(&action.sa_mask);
    ASSERT_EQ(sigaction(SIGUSR1, &action, &previous), 0);
    g_parked.store(false);
    g_release.store(false);
    ASSERT_EQ(pthread_kill(worker, SIGUSR1), 0);
    while (!g_parked.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));

    // Both indices must run, on the caller, while the worker stays parked.
    std::vector<int> calls(2, 0);
    bool all_on_caller = true;
    auto job = std::async(std::launch::async, [&] {
        const pthread_t self = pthread_self();
        pool.run([&](int ith, int) {
            calls[static_cast<size_t>(ith)] += 1;
            all_on_caller = all_on_caller && pthread_equal(pthread_self(), self);
        });
        pool.parallel_for(100, 1, [&](int64_t, int64_t) {});
    });
    const bool finished = job.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
    g_release.store(true);  // let the worker go either way, so that a failure does not hang the test
    job.wait();
    sigaction(SIGUSR1, &previous, nullptr);
    EXPECT_TRUE(finished) << "run() waited for a worker that was not running";
    EXPECT_EQ(calls, (std::vector<int>{1, 1}));
    EXPECT_TRUE(all_on_caller);
    // And the pool works normally once the worker is back.
    std::atomic<int64_t> total{0};
    for (int i = 0; i < 100; ++i) pool.parallel_for(12, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
    EXPECT_EQ(total.load(), 1200);
}

TEST(ThreadPool, DestroysCleanlyWhileIdle) {
    for (int i = 0; i < 20; ++i) {
        ThreadPool pool(3);
        if (i % 2) pool.run([](int, int) {});
    }
}

}  // namespace
}  // namespace sparrow
