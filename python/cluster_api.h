// The low-level API for labs: a virtual cluster that runs one Python
// function per virtual device (python/cluster_api.cc).
#pragma once

#include <pybind11/pybind11.h>

#include <functional>

#include "collectives/group.h"
#include "runtime/device.h"

namespace shardlab::python {

void add_cluster_api(pybind11::module_& m);

// Calls fn(dev, *args()) on device `dev`'s thread (the GIL not held on entry),
// `dev` the Python view of the device (_shardlab.Device; its all_reduce over
// `group`, or over the world when null). A Python exception becomes the
// device's error with its message; a torn-down run's RunAborted passes
// through as Aborted.
void call_device_function(Device& dev, const collectives::ProcessGroup* group, pybind11::handle fn,
                          const std::function<pybind11::tuple()>& args = {});

}  // namespace shardlab::python
