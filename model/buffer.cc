#include "model/buffer.h"

#include "runtime/fiber.h"

namespace shardlab::model {

namespace {
thread_local bool t_phantom = false;
// Each device fiber keeps its own (runtime/fiber.h).
[[maybe_unused]] const bool kept_per_fiber = keep_per_fiber({[]() -> void* { return &t_phantom; }, sizeof(t_phantom)});
}  // namespace

bool phantom_allocation() { return t_phantom; }

PhantomScope::PhantomScope(bool on) : previous_(t_phantom) { t_phantom = on; }
PhantomScope::~PhantomScope() { t_phantom = previous_; }

}  // namespace shardlab::model
