// Finite-difference gradient checking for the model tests (double precision).
//
// Relative error of one element: |a − n| / max(|a|, |n|, floor) where a is
// the analytic gradient, n the 4th-order central difference, and floor = 1e-3 · ‖n‖∞
// of that tensor (so elements whose gradient is ~0 compare on the tensor's
// scale instead of dividing noise by noise). A NaN or Inf on either side
// fails the check (support/compare.h). Each check prints its max relative
// and absolute error next to the tolerance.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace shardlab::model::testing {

// Max relative error of a single kernel's double-precision gradients against
// central finite differences (the kernel tests' tolerance).
inline constexpr double kKernelTol = 1e-6;

struct GradError {
  double max_rel = 0;       // over finite elements
  double max_abs = 0;       // over finite elements
  int64_t worst = -1;       // element index of max_rel
  int64_t non_finite = 0;   // elements where either gradient is NaN or Inf
  double floor = 0;         // of the relative error
};

// Fourth-order central differences of loss() w.r.t. x[0..n), step h; x is restored.
std::vector<double> numeric_grad(const std::function<double()>& loss, double* x, int64_t n,
                                 double h = 1e-4);
GradError compare_grads(const double* analytic, const std::vector<double>& numeric);
// Passes when every element is finite and max relative error <= tol; the
// message gives the max error, the worst element and both gradients there.
::testing::AssertionResult grads_close(const double* analytic, const std::vector<double>& numeric,
                                       double tol);

// A tensor under check: its values (perturbed in place) and analytic gradient.
struct Checked {
  Checked(std::string n, std::vector<double>* v, const std::vector<double>* g)
      : name(std::move(n)), value(v->data()), size(v->size()), grad(g->data()) {}
  Checked(std::string n, double* v, size_t count, const double* g)
      : name(std::move(n)), value(v), size(count), grad(g) {}
  std::string name;
  double* value;
  size_t size;
  const double* grad;
};
// Checks every tensor, prints one line each, EXPECTs grads_close(tol).
// Returns the max relative error over all tensors (NaN if any was not finite).
double check_gradients(const std::string& what, const std::vector<Checked>& tensors,
                       const std::function<double()>& loss, double tol);

// A gradient buffer pre-filled with random values, so a check of delta()
// also proves that backward accumulates (+=) instead of overwriting.
class Accum {
 public:
  Accum(std::mt19937_64& rng, int64_t n);
  double* data() { return buf_.data(); }
  std::vector<double> delta() const;

 private:
  std::vector<double> start_, buf_;
};

std::vector<double> random_vector(std::mt19937_64& rng, int64_t n, double scale = 1.0);
double dot(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace shardlab::model::testing
