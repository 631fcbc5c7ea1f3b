#include "runtime/progress.h"

#include <memory>
#include <mutex>

namespace shardlab {
namespace {
std::mutex g_mu;
std::shared_ptr<const StepObserver> g_observer;  // GUARDED_BY(g_mu)
}  // namespace

void set_step_observer(StepObserver observer) {
  auto next = observer ? std::make_shared<const StepObserver>(std::move(observer)) : nullptr;
  std::lock_guard lock(g_mu);
  g_observer = std::move(next);
}

void report_step(const StepDone& step) {
  std::shared_ptr<const StepObserver> observer;
  {
    std::lock_guard lock(g_mu);
    observer = g_observer;
  }
  if (observer) (*observer)(step);
}

}  // namespace shardlab
