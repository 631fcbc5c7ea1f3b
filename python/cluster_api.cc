// shardlab.Cluster: a Python function per virtual device, on the devices' own
// threads, moving numpy arrays over the virtual links in virtual time.
//
// Each device thread holds the GIL while its Python code runs and releases
// it for every call that may block or take long in C++ (a receive waiting
// for its message, a collective, a send): the devices interleave, and the
// watchdog still sees a device blocked on a link (a Python ring with a
// missing send is a DeadlockError, not a hang). Python's own computation
// takes no virtual time: dev.compute(flops=, bytes=) charges it by the cost
// model, as a kernel of the model does. Ctrl-C stops a device at its next
// call into its device, or, in Python code that never calls one, at its next
// bytecode (RunAborted raised in its thread, python/run_thread.h).
#include "python/cluster_api.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "collectives/collectives.h"
#include "collectives/tuner.h"
#include "python/run_thread.h"
#include "runtime/cluster.h"
#include "runtime/errors.h"

namespace py = pybind11;

namespace shardlab::python {
namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// What a device sends or reduces: float32, the devices' dtype. A float array
// of another width is rounded to it (as torch's .float()); an integer or bool
// array converts only when every value is exact in float32 (|x| <= 2^24);
// None, strings, objects and complex numbers are refused (pybind11's
// forcecast made None a NaN and dropped imaginary parts).
FloatArray float32_array(const py::object& obj, const char* what) {
  if (obj.is_none()) throw ConfigError(fmt::format("{}=None: a numeric array", what));
  const py::array any = py::array::ensure(obj);
  if (!any) throw ConfigError(fmt::format("{}: a numeric array, not {}", what, std::string(py::str(py::type::of(obj).attr("__name__")))));
  const char kind = any.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b')
    throw ConfigError(fmt::format("{}: a real numeric array, not dtype {}", what, std::string(py::str(any.dtype()))));
  FloatArray f = FloatArray::ensure(any);
  if (!f) throw py::error_already_set();
  // Integers: exact in float32, or refused (bools always are).
  auto exact = [&](auto tag) {
    using Int = decltype(tag);
    const auto ints = py::array_t<Int, py::array::c_style | py::array::forcecast>::ensure(any);
    for (py::ssize_t i = 0; i < ints.size(); ++i) {
      const float v = f.data()[i];
      if (std::fabs(v) < 9.2e18f && static_cast<Int>(v) == ints.data()[i]) continue;
      throw ConfigError(fmt::format("{}: {} value {} is not exact in float32, the devices' dtype (integers up to 2^24 are)",
                                    what, std::string(py::str(any.dtype())), ints.data()[i]));
    }
  };
  if (kind == 'i') exact(int64_t{});
  if (kind == 'u') exact(uint64_t{});
  return f;
}

// Raised in Python when the run is torn down under a device (another
// device failed, a deadlock, Ctrl-C); a BaseException, so `except
// Exception` in a device function does not swallow it.
PyObject* g_aborted = nullptr;

// Trace event names must outlive the run (runtime/trace.h): interned here.
const char* intern(const std::string& name) {
  static std::mutex mu;
  static std::set<std::string> names;
  std::lock_guard lock(mu);
  return names.insert(name).first->c_str();
}

class PyDevice {
 public:
  // Its all_reduce runs over `group`, or over the world when null.
  PyDevice(Device& dev, const collectives::ProcessGroup* group) : dev_(dev), group_(group) {}

  int rank() const { return dev_.rank(); }
  int world_size() const { return dev_.world_size(); }
  int node() const { return dev_.node(); }
  Time now() const { return dev_.now(); }

  Stream& stream(const std::string& name) {
    if (name == "comm") return dev_.comm();
    if (name == "compute") return dev_.compute();
    throw ConfigError("stream \"" + name + "\": compute or comm");
  }
  // Another device's rank, else a ConfigError naming the keyword and the
  // valid ranks, before the array is converted or the GIL released (the
  // device's own check, Device::check_peer, names no Python argument).
  void check_peer(const char* what, int peer) const {
    if (peer < 0 || peer >= dev_.world_size() || peer == dev_.rank())
      throw ConfigError(fmt::format("{}={}: another device's rank (0..{}, not this device's {})", what, peer,
                                    dev_.world_size() - 1, dev_.rank()));
  }
  // Sends at once (eager): returns when the last byte leaves the egress port, in ps.
  Time isend(int dst, const py::object& array, Tag tag, const std::string& on) {
    check_peer("dst", dst);
    const FloatArray a = float32_array(array, "isend: array");
    Stream& s = stream(on);
    const std::span<const std::byte> host{reinterpret_cast<const std::byte*>(a.data()), size_t(a.size()) * sizeof(float)};
    const uint64_t modeled = uint64_t(a.size()) * uint64_t(element_size(dev_.precision()));
    py::gil_scoped_release nogil;
    return dev_.isend(s, dst, tag, host, modeled).done;
  }
  void wait_until(Time t, const std::string& on) {
    if (t < 0 || t > Time{1'000'000'000'000'000'000})  // 10^6 s: later times would overflow the clocks
      throw ConfigError(fmt::format("wait_until: time_ps={}: a time in [0, 1e18] ps", t));
    stream(on).wait({t});
  }
  py::array_t<float> recv(int src, Tag tag, const std::string& on) {
    check_peer("src", src);
    Stream& s = stream(on);
    std::optional<Message> m;
    {
      py::gil_scoped_release nogil;
      m.emplace(dev_.recv(s, src, tag));
    }
    py::array_t<float> out(py::ssize_t(m->payload.size() / sizeof(float)));
    std::memcpy(out.mutable_data(), m->payload.data(), m->payload.size());
    return out;
  }
  Time compute(double flops, double bytes, const std::string& name) {
    for (const auto& [what, v] : {std::pair{"flops", flops}, std::pair{"bytes", bytes}})
      if (!std::isfinite(v) || v < 0) throw ConfigError(fmt::format("compute: {}={}: a finite number >= 0", what, v));
    OpCost op;
    op.flops = flops;
    op.bytes = bytes;
    const char* label = intern(name);
    py::gil_scoped_release nogil;
    return dev_.run(dev_.compute(), label, op);
  }
  // NCCL's kernel launch and setup before a collective's first send, on the comm stream.
  void launch(int group_size) {
    if (group_size < 1) throw ConfigError(fmt::format("launch: group_size={}: at least 1", group_size));
    const Time t = collectives::collective_launch(dev_.profile(), group_size);
    if (t > 0) dev_.comm().run("coll.launch", t, 0, 0.0);
  }
  py::array_t<float> all_reduce(const py::object& array, const std::string& op, const std::string& algo,
                                const std::string& proto) {
    const FloatArray a = float32_array(array, "all_reduce: array");
    py::array_t<float> out(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));  // the input's shape
    std::memcpy(out.mutable_data(), a.data(), size_t(a.size()) * sizeof(float));
    collectives::CollOptions opt;
    opt.algo = collectives::parse_algo(algo);
    opt.proto = collectives::parse_proto(proto);
    const collectives::ReduceOp rop = collectives::parse_reduce_op(op);
    collectives::Buffer buf(out.mutable_data(), size_t(out.size()));
    py::gil_scoped_release nogil;
    collectives::all_reduce(dev_, group(), buf, rop, opt);
    return out;
  }
  void synchronize() { dev_.synchronize(); }

 private:
  // The given group, else one world group per device for the run (its tag sequence is the device's).
  const collectives::ProcessGroup& group() {
    if (group_) return *group_;
    if (!world_) world_ = std::make_unique<collectives::ProcessGroup>(collectives::ProcessGroup::world(dev_));
    return *world_;
  }
  Device& dev_;
  const collectives::ProcessGroup* group_;
  std::unique_ptr<collectives::ProcessGroup> world_;
};


nlohmann::json result_json(const RunResult& r) {
  nlohmann::json devices = nlohmann::json::array();
  for (const DeviceStats& d : r.devices)
    devices.push_back({{"rank", d.rank}, {"node", d.node}, {"compute_end_ps", d.compute_end},
                       {"comm_end_ps", d.comm_end}, {"end_ps", d.end()}, {"compute_busy_ps", d.compute_busy},
                       {"comm_busy_ps", d.comm_busy}, {"peak_bytes", d.peak_bytes}});
  return {{"devices", devices}, {"makespan_ps", r.makespan()}};
}

Precision parse_precision(const std::string& p) {
  if (p == "fp32") return Precision::kFp32;
  if (p == "bf16") return Precision::kBf16;
  throw ConfigError("precision \"" + p + "\": fp32 or bf16");
}

// Cluster(profile, devices, nodes, precision, trace).run(fn) -> the run_interruptible dict,
// json {"devices": [...], "makespan_ps": ..., "trace": chrome trace or null}.
py::dict run_cluster(const std::string& profile, int devices, std::optional<int> nodes, const std::string& precision,
                     bool trace, py::handle fn) {
  return run_interruptible([=](Outcome& o) {
    const HardwareProfile p = cli::apply_common({.profile = profile, .nodes = nodes});  // the tool's checks
    Cluster cluster(p, {.world_size = devices, .precision = parse_precision(precision), .trace = trace});
    const RunResult r = cluster.run([fn](Device& dev) { call_device_function(dev, nullptr, fn); });
    nlohmann::json j = result_json(r);
    j["trace"] = trace ? nlohmann::json::parse(chrome_trace_json(r.traces, "shardlab.Cluster")) : nlohmann::json();
    o.json = j.dump();
  });
}

}  // namespace

void call_device_function(Device& dev, const collectives::ProcessGroup* group, py::handle fn,
                          const std::function<py::tuple()>& args) {
  py::gil_scoped_acquire gil;
  PyDevice pd(dev, group);
  const PythonDeviceThread interruptible(g_aborted);  // Ctrl-C reaches a loop that never calls in
  try {
    fn(py::cast(&pd, py::return_value_policy::reference), *(args ? args() : py::tuple()));
  } catch (py::error_already_set& e) {
    if (e.matches(g_aborted)) throw Aborted{};
    throw std::runtime_error(e.what());
  }
}

void add_cluster_api(py::module_& m) {
  g_aborted = PyErr_NewException("_shardlab.RunAborted", PyExc_BaseException, nullptr);
  m.add_object("RunAborted", py::handle(g_aborted));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Aborted&) {
      PyErr_SetString(g_aborted, "the run is being torn down");
    }
  });
  py::class_<PyDevice>(m, "Device", "One virtual GPU, as its function sees it (times in picoseconds)")
      .def_property_readonly("rank", &PyDevice::rank)
      .def_property_readonly("world_size", &PyDevice::world_size)
      .def_property_readonly("node", &PyDevice::node)
      .def_property_readonly("now_ps", &PyDevice::now, "The latest time on any of its streams")
      .def("isend", &PyDevice::isend, py::arg("dst"), py::arg("array"), py::arg("tag") = 0, py::arg("stream") = "comm")
      .def("wait_until", &PyDevice::wait_until, py::arg("time_ps"), py::arg("stream") = "comm")
      .def("recv", &PyDevice::recv, py::arg("src"), py::arg("tag") = 0, py::arg("stream") = "comm")
      .def("compute", &PyDevice::compute, py::arg("flops") = 0.0, py::arg("bytes") = 0.0, py::arg("name") = "compute")
      .def("launch", &PyDevice::launch, py::arg("group_size"))
      .def("all_reduce", &PyDevice::all_reduce, py::arg("array"), py::arg("op") = "sum", py::arg("algo") = "auto",
           py::arg("proto") = "auto")
      .def("synchronize", &PyDevice::synchronize);
  m.def("run_cluster", &run_cluster, py::arg("profile"), py::arg("devices"), py::arg("nodes"), py::arg("precision"),
        py::arg("trace"), py::arg("fn"));
}

}  // namespace shardlab::python
