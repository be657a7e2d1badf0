// ThreadPool: every member runs once per job on its own thread, and errors come back to the
// caller.
#include "sluice/core/thread_pool.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/core/error.h"

namespace sluice {
namespace {

TEST(ThreadPool, RunsEveryMemberOnItsOwnThread) {
  ThreadPool pool(4);
  ASSERT_EQ(pool.size(), 4);
  for (int job = 0; job < 50; ++job) {
    std::mutex mu;
    std::set<int> members;
    std::set<std::thread::id> threads;
    pool.RunOnAll([&](int member) {
      std::lock_guard lock(mu);
      members.insert(member);
      threads.insert(std::this_thread::get_id());
    });
    EXPECT_EQ(members, (std::set<int>{0, 1, 2, 3}));
    EXPECT_EQ(threads.size(), 4u);
    EXPECT_TRUE(threads.count(std::this_thread::get_id()));  // the caller is member 0
  }
}

TEST(ThreadPool, RethrowsAWorkerErrorAfterEveryoneFinished) {
  ThreadPool pool(3);
  std::atomic<int> finished{0};
  try {
    pool.RunOnAll([&](int member) {
      if (member == 2) throw std::runtime_error("member 2 failed");
      finished.fetch_add(1);
    });
    FAIL() << "expected the error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "member 2 failed");
  }
  EXPECT_EQ(finished.load(), 2);
  // Still usable.
  std::atomic<int> calls{0};
  pool.RunOnAll([&](int) { calls.fetch_add(1); });
  EXPECT_EQ(calls.load(), 3);
}

// A kParts job's members are parts of one kernel: kernels inside run serially (InJob). A kOwnWork
// job's members (pipeline stages) keep their own pools: inside, InJob is false and a pool of
// their own runs on threads of its own — on the same threads job after job.
TEST(ThreadPool, OwnWorkMembersRunPoolsOfTheirOwnOnThreadsThatLast) {
  EXPECT_FALSE(ThreadPool::InJob());
  ThreadPool stages(2, ThreadPool::Jobs::kOwnWork);
  std::vector<std::thread::id> first(2), again(2);
  std::atomic<int> nested_members{0}, in_job_inside_nested{0}, in_job_in_stage{0};
  for (std::vector<std::thread::id>* ids : {&first, &again}) {
    stages.RunOnAll([&](int stage) {
      (*ids)[stage] = std::this_thread::get_id();
      if (ThreadPool::InJob()) in_job_in_stage.fetch_add(1);
      ThreadPool own(2);
      std::set<std::thread::id> threads;
      std::mutex mu;
      own.RunOnAll([&](int) {
        nested_members.fetch_add(1);
        if (ThreadPool::InJob()) in_job_inside_nested.fetch_add(1);
        std::lock_guard lock(mu);
        threads.insert(std::this_thread::get_id());
      });
      EXPECT_EQ(threads.size(), 2u);
      EXPECT_FALSE(ThreadPool::InJob());
    });
  }
  EXPECT_EQ(in_job_in_stage.load(), 0);
  EXPECT_EQ(nested_members.load(), 8);        // 2 jobs × 2 stages × 2 members
  EXPECT_EQ(in_job_inside_nested.load(), 8);  // each a kParts member
  EXPECT_EQ(first, again);
  EXPECT_EQ(first[0], std::this_thread::get_id());
  EXPECT_FALSE(ThreadPool::InJob());
  // A kParts pool marks its members, the caller included, for the job only.
  ThreadPool parts(2);
  std::atomic<int> marked{0};
  parts.RunOnAll([&](int) { marked.fetch_add(ThreadPool::InJob() ? 1 : 0); });
  EXPECT_EQ(marked.load(), 2);
  EXPECT_FALSE(ThreadPool::InJob());
}

TEST(ThreadPool, SingleThreadRunsOnTheCaller) {
  ThreadPool pool(1);
  std::thread::id id;
  pool.RunOnAll([&](int member) {
    EXPECT_EQ(member, 0);
    id = std::this_thread::get_id();
  });
  EXPECT_EQ(id, std::this_thread::get_id());
  EXPECT_THROW(ThreadPool(0), InvalidArgument);
}

TEST(ThreadPool, CountsOutsideTheBoundAreInvalidArguments) {
  EXPECT_THROW(ThreadPool(0), InvalidArgument);
  EXPECT_THROW(ThreadPool(ThreadPool::kMaxThreads + 1), InvalidArgument);
}

// Regression: a thread the system refused used to end in std::terminate (the vector of workers
// unwound with joinable threads in it). Now the started workers are joined and the error is a
// ResourceError. The child process caps its address space just above what it uses, so that the
// stacks of the later workers cannot be mapped.
TEST(ThreadPool, ARefusedThreadIsAResourceErrorNotATerminate) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers reserve terabytes of address space; an address-space cap breaks them";
#else
  auto body = [] {
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;  // the address space in use, in pages
    const rlim_t used = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE));
    const rlimit cap{used + (64u << 20), used + (64u << 20)};  // room for a few 8 MiB stacks
    if (::setrlimit(RLIMIT_AS, &cap) != 0) std::_Exit(3);
    // The message says what to ask for less of: intra-op threads, or pipeline stages.
    for (const auto& [jobs, ask] : {std::pair{ThreadPool::Jobs::kParts, "threads (--threads)"},
                                    std::pair{ThreadPool::Jobs::kOwnWork, "stages (--stages)"}}) {
      try {
        ThreadPool pool(64, jobs);
        std::_Exit(4);  // every stack fitted: the cap did not bite
      } catch (const ResourceError& e) {
        const std::string what = e.what();
        if (what.find("cannot start thread") == std::string::npos ||
            what.find(ask) == std::string::npos) {
          std::_Exit(5);
        }
      } catch (...) {
        std::_Exit(6);
      }
    }
    std::_Exit(0);
  };
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child re-runs from main, alone
  EXPECT_EXIT(body(), ::testing::ExitedWithCode(0), "");
#endif
}

}  // namespace
}  // namespace sluice
