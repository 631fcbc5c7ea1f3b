// Python functions graded by the labs' own checks. The arrays handed to a
// learner's function are views of the grader's buffers (inputs read-only),
// valid during the call only; its math costs no virtual time, as in C++.
#include "python/lab_graders.h"

#include <pybind11/numpy.h>
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "collectives/collectives.h"
#include "labs/02-ring-allreduce/grader.h"
#include "labs/04-tensor-parallel/grader.h"
#include "labs/05-pipeline-schedules/grader.h"
#include "labs/05-pipeline-schedules/schedules.h"
#include "python/cluster_api.h"
#include "python/run_thread.h"
#include "runtime/errors.h"

namespace py = pybind11;

namespace shardlab::python {
namespace {

// A numpy view of `rows` x `cols` floats at p (1-D when rows is 0), not owning them.
py::array_t<float> view(const float* p, int64_t rows, int64_t cols, bool writable) {
  const py::capsule no_owner(p, [](void*) {});  // the grader owns the buffer
  std::vector<py::ssize_t> shape{rows, cols};
  if (rows == 0) shape.erase(shape.begin());
  py::array_t<float> a(shape, p, no_owner);
  if (!writable) a.attr("setflags")(py::arg("write") = false);
  return a;
}

labs::RingAllReduce ring(py::handle fn) {
  return [fn](Device& dev, const collectives::ProcessGroup& g, std::span<float> data) {
    call_device_function(dev, &g, fn, [&] { return py::make_tuple(view(data.data(), 0, int64_t(data.size()), true)); });
  };
}

// fn(dev, out (N,OC), inp (N,C), weight (OC,C), bias (OC)).
labs::TpForward forward(py::handle fn) {
  return [fn](Device& dev, const collectives::ProcessGroup& g, float* out, const float* inp, const float* w,
              const float* b, int64_t n, int c, int oc) {
    call_device_function(dev, &g, fn, [&] {
      return py::make_tuple(view(out, n, oc, true), view(inp, n, c, false), view(w, oc, c, false), view(b, 0, oc, false));
    });
  };
}

// fn(dev, dinp (N,C), dweight (OC,C), dbias (OC), dout (N,OC), inp (N,C), weight (OC,C)).
labs::TpBackward backward(py::handle fn) {
  return [fn](Device& dev, const collectives::ProcessGroup& g, float* dinp, float* dw, float* db, const float* dout,
              const float* inp, const float* w, int64_t n, int c, int oc) {
    call_device_function(dev, &g, fn, [&] {
      return py::make_tuple(view(dinp, n, c, true), view(dw, oc, c, true), view(db, 0, oc, true),
                            view(dout, n, oc, false), view(inp, n, c, false), view(w, oc, c, false));
    });
  };
}

// fn(pp, micro_batches) -> a list per rank of Actions; called on the grader's thread.
labs::ScheduleFn schedule(py::handle fn) {
  return [fn](int pp, int m) {
    py::gil_scoped_acquire gil;
    try {
      return fn(pp, m).cast<parallel::Schedule>();
    } catch (py::error_already_set& e) {
      throw std::runtime_error(e.what());
    } catch (const py::cast_error&) {
      throw ConfigError("a schedule function must return a list per rank of lists of Actions");
    }
  };
}

// Runs a grader off the GIL (Ctrl-C cancels it); its report is the outcome's json.
py::dict grade(const std::function<int(std::string*)>& grader) {
  return run_interruptible([grader](Outcome& o) {
    std::string report;
    o.code = grader(&report);
    o.json = nlohmann::json{{"report", report}}.dump();
  });
}

std::vector<parallel::Action> actions(void (*add)(std::vector<parallel::Action>&, int, int, int), int pp, int rank,
                                      int mb) {
  std::vector<parallel::Action> out;
  add(out, pp, rank, mb);
  return out;
}

void add_actions(py::module_& m) {
  using K = parallel::ActionKind;
  py::enum_<K>(m, "ActionKind")
      .value("forward", K::kForward)
      .value("backward", K::kBackward)
      .value("send_activation", K::kSendActivation)
      .value("recv_activation", K::kRecvActivation)
      .value("send_grad", K::kSendGrad)
      .value("recv_grad", K::kRecvGrad)
      .value("backward_input", K::kBackwardInput)
      .value("backward_weight", K::kBackwardWeight);
  py::class_<parallel::Action>(m, "Action", "One step of one pipeline rank (model/parallel/pipeline/schedule.h)")
      .def(py::init<K, int, int, int, int>(), py::arg("kind"), py::arg("micro_batch"), py::arg("chunk") = 0,
           py::arg("peer") = -1, py::arg("buffer") = -1)
      .def_readwrite("kind", &parallel::Action::kind)
      .def_readwrite("micro_batch", &parallel::Action::micro_batch)
      .def_readwrite("chunk", &parallel::Action::chunk)
      .def_readwrite("peer", &parallel::Action::peer)
      .def_readwrite("buffer", &parallel::Action::buffer)
      .def(py::self == py::self)
      .def("__repr__", [](const parallel::Action& a) {
        const std::string kind = py::str(py::cast(a.kind).attr("name"));
        return "Action(" + kind + ", mb=" + std::to_string(a.micro_batch) +
               (a.peer >= 0 ? ", peer=" + std::to_string(a.peer) : "") + ")";
      });
  m.def("forward_actions", [](int pp, int rank, int mb) { return actions(labs::add_forward, pp, rank, mb); },
        py::arg("pp"), py::arg("rank"), py::arg("micro_batch"),
        "Micro-batch mb's forward on `rank` with its receive before it and its send after it (lab 5's add_forward)");
  m.def("backward_actions", [](int pp, int rank, int mb) { return actions(labs::add_backward, pp, rank, mb); },
        py::arg("pp"), py::arg("rank"), py::arg("micro_batch"), "The same for its backward (add_backward)");
}

}  // namespace

void add_lab_graders(py::module_& m) {
  add_actions(m);
  m.def(
      "chunk_range",
      [](size_t count, int n, int i) {
        const Range r = collectives::chunk_range(count, n, i);
        return py::slice(r.begin, r.begin + r.size, 1);
      },
      py::arg("count"), py::arg("n"), py::arg("i"), "Chunk i of n of `count` elements, as the collectives split a buffer");
  m.def("grade_lab_02", [](py::handle fn) { return grade([&](std::string* out) { return labs::grade_ring_all_reduce(ring(fn), out); }); },
        py::arg("ring_all_reduce"));
  m.def(
      "grade_lab_04",
      [](py::handle cf, py::handle cb, py::handle rf, py::handle rb) {
        return grade([&](std::string* out) {
          return labs::grade_tp_linear({forward(cf), backward(cb), forward(rf), backward(rb)}, out);
        });
      },
      py::arg("column_parallel_forward"), py::arg("column_parallel_backward"), py::arg("row_parallel_forward"),
      py::arg("row_parallel_backward"));
  m.def("grade_lab_05", [](py::handle gpipe, py::handle one_f_one_b) {
        return grade([&](std::string* out) { return labs::grade_schedules(schedule(gpipe), schedule(one_f_one_b), out); });
      },
      py::arg("gpipe"), py::arg("one_f_one_b"));
}

}  // namespace shardlab::python
