// Fibers: several device programs on one host thread (ClusterOptions::
// host_threads).
//
// A device program that waits on the host (a receive, a meeting, a serving
// device waiting for its next batch) sleeps on its HostWaiter. With one OS
// thread per device, that is a condition variable: every wake-up is a
// futex call and a context switch, and on a host with fewer cores than
// devices the woken thread then waits for a core behind every other
// runnable thread of the machine. Serving tiny at tp 8 on 2 cores spent
// most of its wall time in those hand-offs (bench/README.md).
//
// A FiberHost instead runs its devices' programs as fibers (ucontext, each
// on its own stack) on the one thread that calls run(): a fiber that waits
// gives the thread to the next ready fiber of the same host, and a wake-up
// from a fiber of the same host is a push on the ready list (no system
// call, no scheduler). A wake-up from another thread (the serving
// scheduler, a fiber of another host) pushes too and wakes the host thread
// if it sleeps with nothing ready. Fibers never move between threads.
//
// The bits and virtual times cannot change: the programs' results never
// depend on the order in which the host runs them (DESIGN.md, invariant 2),
// and only the host's order differs.
//
// What a fiber must not do: wait on the host other than through a
// HostWaiter (a condition variable would stop its host thread, and with it
// the fibers that would wake it), or hold a mutex or an exception in flight
// across a wait. Thread-local state the programs set (model/buffer.cc's
// phantom flag, model/arithmetic.cc's arithmetic) is kept per fiber when
// registered with keep_per_fiber: the host saves it when a fiber waits and
// restores it when the fiber resumes; unregistered thread-locals are the
// host thread's (caches and scratch buffers, used between two waits).
//
// Thread safety: add() before run(); run() on one thread; HostWaiter::wake
// from any thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace shardlab {

class FiberHost;
struct Fiber;

// Where one device program sleeps on the host until another wakes it.
class HostWaiter {
 public:
  // The program runs as `fiber` (before it starts; null: its own thread).
  void bind(Fiber* fiber) { fiber_ = fiber; }
  // With `lock` held: sleeps until wake(), or spuriously (callers loop on
  // their condition); returns with `lock` held again.
  void wait(std::unique_lock<std::mutex>& lock);
  // Wakes the program if it sleeps, else makes its next wait() return at
  // once (a fiber) or does nothing (a thread: its condition is re-checked
  // under the lock the waker changed it under). Any thread.
  void wake();

 private:
  std::condition_variable cv_;
  Fiber* fiber_ = nullptr;
};

// A thread-local variable (of at most 16 bytes, trivially copyable) that
// each fiber keeps as its own. `address` returns the calling thread's
// instance. Register at static initialisation, before any host runs.
struct FiberLocal {
  void* (*address)();
  size_t bytes;
};
bool keep_per_fiber(FiberLocal local);

// Times a fiber gave its host thread away in this process so far (tests:
// the fibers ran).
uint64_t fiber_switches();

// Two programs interleaved on the calling thread, each on its own stack:
// run(a, b) runs `a` until it calls Interleave::yield(), then `b` until it
// does, then `a` again, and so on; once one has returned, the other's
// yields return at once and it runs to its end. The switch points are the
// programs' own, so the interleaving is deterministic (Megatron's combined
// 1F1B: one micro-batch's forward and another's backward as one step,
// model/parallel/pipeline/executor.h). yield() outside run() returns at once.
// An exception from either is rethrown by run() after both have ended.
// Not on a FiberHost's fiber (its switches would save the wrong stack):
// run() there is a logic error. Thread safety: per thread.
class Interleave {
 public:
  static void run(const std::function<void()>& a, const std::function<void()>& b);
  static void yield();
  static bool active();  // inside run(), on either program
};

class FiberHost {
 public:
  FiberHost();
  ~FiberHost();
  FiberHost(const FiberHost&) = delete;
  FiberHost& operator=(const FiberHost&) = delete;

  // A program to run; `body` must not throw (the cluster's device body
  // catches everything). Allocates its stack now.
  Fiber& add(std::function<void()> body);
  // Runs every added fiber on the calling thread until each has returned.
  void run();

  // Readies `f` (one of this host's) if it sleeps in park; else its next
  // park returns at once.
  void unpark(Fiber& f);
  // The calling fiber (running on this host) sleeps until unpark.
  void park(Fiber& f, std::unique_lock<std::mutex>& lock);

 private:
  friend struct Fiber;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardlab
