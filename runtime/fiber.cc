// Fibers on a host thread: see fiber.h.
#include "runtime/fiber.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <system_error>

#include "runtime/errors.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define SHARDLAB_ASAN_FIBERS 1
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define SHARDLAB_TSAN_FIBERS 1
#endif

namespace shardlab {

namespace {

// 8 MiB, a Linux thread's default stack: only the pages a program touches
// are ever backed.
constexpr size_t kStackBytes = size_t{8} << 20;
constexpr int kMaxLocals = 8;
constexpr size_t kLocalBytes = 16;

std::atomic<uint64_t> switches{0};
thread_local bool t_on_fiber = false;  // a FiberHost fiber runs on this thread

// A stack of kStackBytes behind a guard page (mmap'd, only touched pages backed).
struct Stack {
  void* map = nullptr;
  size_t map_bytes = 0;
  void* base = nullptr;
  Stack() {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    map_bytes = kStackBytes + page;
    map = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
               -1, 0);
    if (map == MAP_FAILED) {
      map = nullptr;
      throw std::system_error(errno, std::generic_category(), "a fiber's stack");
    }
    if (mprotect(map, page, PROT_NONE) != 0)
      throw std::system_error(errno, std::generic_category(), "a fiber's guard page");
    base = static_cast<char*>(map) + page;
  }
  ~Stack() {
    if (map) munmap(map, map_bytes);
  }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
};

struct Registered {
  std::array<FiberLocal, kMaxLocals> list{};
  int n = 0;
};
Registered& registered() {
  static Registered r;
  return r;
}

using LocalValues = std::array<std::array<unsigned char, kLocalBytes>, kMaxLocals>;

void save_locals(LocalValues& v) {
  const Registered& r = registered();
  for (int i = 0; i < r.n; ++i)
    std::memcpy(v[size_t(i)].data(), r.list[size_t(i)].address(), r.list[size_t(i)].bytes);
}

void restore_locals(const LocalValues& v) {
  const Registered& r = registered();
  for (int i = 0; i < r.n; ++i)
    std::memcpy(r.list[size_t(i)].address(), v[size_t(i)].data(), r.list[size_t(i)].bytes);
}

}  // namespace

uint64_t fiber_switches() { return switches.load(std::memory_order_relaxed); }

bool keep_per_fiber(FiberLocal local) {
  Registered& r = registered();
  SHARDLAB_CHECK(r.n < kMaxLocals && local.bytes <= kLocalBytes,
                 "keep_per_fiber: too many or too large");
  r.list[size_t(r.n++)] = local;
  return true;
}

struct Fiber {
  FiberHost* owner = nullptr;
  std::function<void()> body;
  ucontext_t ctx{};
  Stack stack;  // guard page, then kStackBytes
  bool parked = false, notified = false;  // under the host's mutex
  bool done = false;                      // set by the fiber itself, read by its host thread
  LocalValues locals{};
  void* asan_fake = nullptr;
#if SHARDLAB_TSAN_FIBERS
  void* tsan = nullptr;
#endif
  ~Fiber() {
#if SHARDLAB_TSAN_FIBERS
    if (tsan) __tsan_destroy_fiber(tsan);
#endif
  }
};

struct FiberHost::Impl {
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::mutex mu;
  std::condition_variable cv;
  // Ready fibers, first in first out: a ring as large as the fibers (each
  // is in it at most once), so readying one never allocates.
  std::vector<Fiber*> ring;
  size_t head = 0, count = 0;  // under mu
  bool sleeping = false;       // under mu: run() waits on cv
  ucontext_t main{};
  std::exception_ptr error;
  const void* main_bottom = nullptr;  // the host thread's stack (ASan)
  size_t main_size = 0;
  void* main_fake = nullptr;
#if SHARDLAB_TSAN_FIBERS
  void* main_tsan = nullptr;
#endif

  void push(Fiber* f) {
    ring[(head + count) % ring.size()] = f;
    ++count;
  }
  Fiber* pop() {
    Fiber* f = ring[head];
    head = (head + 1) % ring.size();
    --count;
    return f;
  }

  // The host thread runs `f` until it parks or returns.
  void enter(Fiber& f) {
    restore_locals(f.locals);
#if SHARDLAB_ASAN_FIBERS
    __sanitizer_start_switch_fiber(&main_fake, f.stack.base, kStackBytes);
#endif
#if SHARDLAB_TSAN_FIBERS
    __tsan_switch_to_fiber(f.tsan, 0);
#endif
    t_on_fiber = true;
    swapcontext(&main, &f.ctx);
    t_on_fiber = false;
#if SHARDLAB_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(main_fake, nullptr, nullptr);
#endif
    save_locals(f.locals);
  }

  // `f` gives the thread back to the host (for good when `finished`).
  void leave(Fiber& f, bool finished) {
#if SHARDLAB_ASAN_FIBERS
    __sanitizer_start_switch_fiber(finished ? nullptr : &f.asan_fake, main_bottom, main_size);
#endif
#if SHARDLAB_TSAN_FIBERS
    __tsan_switch_to_fiber(main_tsan, 0);
#endif
    swapcontext(&f.ctx, &main);
#if SHARDLAB_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(f.asan_fake, &main_bottom, &main_size);
#endif
  }

  static void start(unsigned lo, unsigned hi) {
    Fiber& f = *reinterpret_cast<Fiber*>((uintptr_t(hi) << 32) | uintptr_t(lo));
    Impl& h = *f.owner->impl_;
#if SHARDLAB_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(nullptr, &h.main_bottom, &h.main_size);
#endif
    try {
      f.body();
    } catch (...) {  // fiber.h: bodies do not throw; if one does, run() rethrows it
      if (!h.error) h.error = std::current_exception();
    }
    f.done = true;
    h.leave(f, true);
    std::terminate();  // never resumed
  }
};

void HostWaiter::wait(std::unique_lock<std::mutex>& lock) {
  if (fiber_) return fiber_->owner->park(*fiber_, lock);
  cv_.wait(lock);
}

void HostWaiter::wake() {
  if (fiber_) return fiber_->owner->unpark(*fiber_);
  cv_.notify_one();
}

FiberHost::FiberHost() : impl_(std::make_unique<Impl>()) {}
FiberHost::~FiberHost() = default;

Fiber& FiberHost::add(std::function<void()> body) {
  auto f = std::make_unique<Fiber>();
  f->owner = this;
  f->body = std::move(body);
  if (getcontext(&f->ctx) != 0)
    throw std::system_error(errno, std::generic_category(), "getcontext");
  f->ctx.uc_stack.ss_sp = f->stack.base;
  f->ctx.uc_stack.ss_size = kStackBytes;
  f->ctx.uc_link = nullptr;
  const auto p = reinterpret_cast<uintptr_t>(f.get());
  makecontext(&f->ctx, reinterpret_cast<void (*)()>(&Impl::start), 2, unsigned(p & 0xffffffffu),
              unsigned(p >> 32));
#if SHARDLAB_TSAN_FIBERS
  f->tsan = __tsan_create_fiber(0);
#endif
  impl_->fibers.push_back(std::move(f));
  return *impl_->fibers.back();
}

void FiberHost::run() {
  Impl& h = *impl_;
  if (h.fibers.empty()) return;
  // Every fiber starts from the host thread's thread-locals, as a new
  // thread starts from their initial values.
  LocalValues own;
  save_locals(own);
  h.ring.assign(h.fibers.size(), nullptr);
  {
    std::lock_guard lock(h.mu);
    for (auto& f : h.fibers) {
      f->locals = own;
      h.push(f.get());
    }
  }
#if SHARDLAB_TSAN_FIBERS
  h.main_tsan = __tsan_get_current_fiber();
#endif
  for (size_t live = h.fibers.size(); live > 0;) {
    Fiber* f;
    {
      std::unique_lock lock(h.mu);
      while (h.count == 0) {
        h.sleeping = true;
        h.cv.wait(lock);
      }
      h.sleeping = false;
      f = h.pop();
    }
    h.enter(*f);
    if (f->done) --live;
  }
  restore_locals(own);
  if (h.error) std::rethrow_exception(h.error);
}

void FiberHost::unpark(Fiber& f) {
  Impl& h = *impl_;
  bool wake = false;
  {
    std::lock_guard lock(h.mu);
    if (!f.parked) {
      f.notified = true;
      return;
    }
    f.parked = false;
    h.push(&f);
    wake = h.sleeping;
  }
  if (wake) h.cv.notify_one();
}

void FiberHost::park(Fiber& f, std::unique_lock<std::mutex>& lock) {
  Impl& h = *impl_;
  {
    std::lock_guard g(h.mu);
    if (f.notified) {
      f.notified = false;
      return;
    }
    f.parked = true;
  }
  // A waker may ready `f` from here on; only this thread takes it off the
  // ready list, after `f` has left.
  lock.unlock();
  switches.fetch_add(1, std::memory_order_relaxed);
  h.leave(f, false);
  lock.lock();
}

// ---- Interleave ------------------------------------------------------------

namespace {

// One thread's two program contexts, their stacks kept for the thread's
// later pairs (a step runs one pair per micro-batch).
struct Pair {
  Stack stacks[2];
  ucontext_t main{}, ctx[2]{};
  const std::function<void()>* body[2] = {nullptr, nullptr};
  bool done[2] = {false, false};
  int cur = 0;
  bool running = false;
  std::exception_ptr error;
  const void* main_bottom = nullptr;  // ASan: the stack run() was called on
  size_t main_size = 0;
  void* main_fake = nullptr;
  void* fake[2] = {nullptr, nullptr};
#if SHARDLAB_TSAN_FIBERS
  void* tsan[2] = {__tsan_create_fiber(0), __tsan_create_fiber(0)};
  void* main_tsan = nullptr;
  ~Pair() {
    for (void* t : tsan) __tsan_destroy_fiber(t);
  }
#endif

  // The thread runs program `cur` until it yields or returns.
  void enter() {
#if SHARDLAB_ASAN_FIBERS
    __sanitizer_start_switch_fiber(&main_fake, stacks[cur].base, kStackBytes);
#endif
#if SHARDLAB_TSAN_FIBERS
    __tsan_switch_to_fiber(tsan[cur], 0);
#endif
    swapcontext(&main, &ctx[cur]);
#if SHARDLAB_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(main_fake, nullptr, nullptr);
#endif
  }
  // Program `cur` gives the thread back to run() (for good when `finished`).
  void leave(bool finished) {
    const int me = cur;
#if SHARDLAB_ASAN_FIBERS
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake[me], main_bottom, main_size);
#endif
#if SHARDLAB_TSAN_FIBERS
    __tsan_switch_to_fiber(main_tsan, 0);
#endif
    swapcontext(&ctx[me], &main);
#if SHARDLAB_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(fake[me], &main_bottom, &main_size);
#endif
  }
  static void start(unsigned lo, unsigned hi);
};

thread_local std::unique_ptr<Pair> t_pair;

void Pair::start(unsigned lo, unsigned hi) {
  Pair& p = *reinterpret_cast<Pair*>((uintptr_t(hi) << 32) | uintptr_t(lo));
#if SHARDLAB_ASAN_FIBERS
  __sanitizer_finish_switch_fiber(nullptr, &p.main_bottom, &p.main_size);
#endif
  const int me = p.cur;
  try {
    (*p.body[me])();
  } catch (...) {
    if (!p.error) p.error = std::current_exception();
  }
  p.done[me] = true;
  p.leave(true);
  std::terminate();  // never resumed
}

}  // namespace

bool Interleave::active() { return t_pair && t_pair->running; }

void Interleave::yield() {
  if (!active()) return;
  Pair& p = *t_pair;
  if (p.done[1 - p.cur]) return;  // the partner has ended: run on
  switches.fetch_add(1, std::memory_order_relaxed);
  p.leave(false);
}

void Interleave::run(const std::function<void()>& a, const std::function<void()>& b) {
  SHARDLAB_CHECK(!t_on_fiber, "Interleave::run on a FiberHost fiber");
  SHARDLAB_CHECK(!active(), "Interleave::run inside an Interleave");
  if (!t_pair) t_pair = std::make_unique<Pair>();
  Pair& p = *t_pair;
  p.body[0] = &a;
  p.body[1] = &b;
  p.done[0] = p.done[1] = false;
  p.error = nullptr;
  const auto self = reinterpret_cast<uintptr_t>(&p);
  for (int i = 0; i < 2; ++i) {
    if (getcontext(&p.ctx[i]) != 0) throw std::system_error(errno, std::generic_category(), "getcontext");
    p.ctx[i].uc_stack.ss_sp = p.stacks[i].base;
    p.ctx[i].uc_stack.ss_size = kStackBytes;
    p.ctx[i].uc_link = nullptr;
    makecontext(&p.ctx[i], reinterpret_cast<void (*)()>(&Pair::start), 2, unsigned(self & 0xffffffffu),
                unsigned(self >> 32));
  }
#if SHARDLAB_TSAN_FIBERS
  p.main_tsan = __tsan_get_current_fiber();
#endif
  p.running = true;
  p.cur = 0;
  while (!(p.done[0] && p.done[1])) {
    if (p.done[p.cur]) p.cur = 1 - p.cur;
    p.enter();
    if (!p.done[1 - p.cur]) p.cur = 1 - p.cur;
  }
  p.running = false;
  if (p.error) std::rethrow_exception(p.error);
}

}  // namespace shardlab
