// Eigen views over raw row-major host buffers (internal to model/ .cc files).
#pragma once

#include <Eigen/Core>

namespace shardlab::model {

template <typename Real>
using RowMajorMat = Eigen::Matrix<Real, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename Real>
using RowVec = Eigen::Matrix<Real, 1, Eigen::Dynamic>;

template <typename Real>
using MatMap = Eigen::Map<RowMajorMat<Real>>;
template <typename Real>
using ConstMatMap = Eigen::Map<const RowMajorMat<Real>>;
// A (rows, cols) block of a wider row-major buffer: row r starts at p + r*stride.
template <typename Real>
using StridedMap = Eigen::Map<RowMajorMat<Real>, 0, Eigen::OuterStride<>>;
template <typename Real>
using ConstStridedMap = Eigen::Map<const RowMajorMat<Real>, 0, Eigen::OuterStride<>>;
template <typename Real>
using RowMap = Eigen::Map<RowVec<Real>>;
template <typename Real>
using ConstRowMap = Eigen::Map<const RowVec<Real>>;

// Elementwise (array) views of n contiguous values.
template <typename Real>
using ArrayMap = Eigen::Map<Eigen::Array<Real, Eigen::Dynamic, 1>>;
template <typename Real>
using ConstArrayMap = Eigen::Map<const Eigen::Array<Real, Eigen::Dynamic, 1>>;

}  // namespace shardlab::model
