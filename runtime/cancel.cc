#include "runtime/cancel.h"

#include <atomic>

namespace shardlab {
namespace {
std::atomic<bool> g_cancel{false};
}  // namespace

void request_cancel() { g_cancel.store(true, std::memory_order_release); }
void clear_cancel() { g_cancel.store(false, std::memory_order_release); }
bool cancel_requested() { return g_cancel.load(std::memory_order_acquire); }

}  // namespace shardlab
