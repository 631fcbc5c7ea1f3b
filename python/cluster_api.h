// The low-level API for labs: a virtual cluster that runs one Python
// function per virtual device (python/cluster_api.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace shardlab::python {

void add_cluster_api(pybind11::module_& m);

}  // namespace shardlab::python
