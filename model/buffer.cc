#include "model/buffer.h"

namespace shardlab::model {

namespace {
thread_local bool t_phantom = false;
}  // namespace

bool phantom_allocation() { return t_phantom; }

PhantomScope::PhantomScope(bool on) : previous_(t_phantom) { t_phantom = on; }
PhantomScope::~PhantomScope() { t_phantom = previous_; }

}  // namespace shardlab::model
