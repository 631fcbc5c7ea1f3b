// safetensors checkpoints: the format PyTorch users load with
// `safetensors.torch.load_file`.
//
// Layout (all integers little-endian, whatever the host):
//   [8 bytes]  N, the header length in bytes (uint64)
//   [N bytes]  JSON object: tensor name -> {"dtype": "F32", "shape": [...],
//              "data_offsets": [begin, end]} with offsets relative to the data
//              section; optional "__metadata__": {string: string}. shardlab
//              stores its config as a JSON string under "shardlab_config".
//   [rest]     the data section: tensors back to back, in sorted name order
//              (as the Python writer lays them out), no gaps.
//
// Only F32 is supported. The reader checks everything before it trusts a
// number: any corrupt file (truncated, bad JSON, offsets out of range or
// overlapping, sizes that do not match the shape, another dtype, negative
// shapes) is a ConfigError with one line naming the file and the problem;
// nothing is allocated beyond the file's own size.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tensor.h"  // Shape

namespace shardlab::model {

// The metadata key under which shardlab stores its config (a JSON string).
inline constexpr const char* kShardlabConfigKey = "shardlab_config";

// A tensor to write: `data` points at shape_numel(shape) floats, row-major.
struct NamedTensorView {
  std::string name;
  Shape shape;
  const float* data = nullptr;
};

// One tensor read from a file.
struct LoadedTensor {
  Shape shape;
  std::vector<float> data;  // shape_numel(shape) floats, row-major
};

// The whole content of a safetensors file, in host memory.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  SafetensorsFile(std::string origin, std::map<std::string, LoadedTensor> tensors,
                  std::map<std::string, std::string> metadata);

  const std::string& origin() const { return origin_; }  // the path, for messages
  std::vector<std::string> names() const;                // sorted
  size_t size() const { return tensors_.size(); }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Throws ConfigError naming the file and the tensor when it is missing.
  const LoadedTensor& at(const std::string& name) const;
  // As at(), and also throws when the shape is not `expected` (both shapes
  // in the message). Returns the data.
  std::span<const float> get(const std::string& name, const Shape& expected) const;

 private:
  std::string origin_;
  std::map<std::string, LoadedTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Serializes to the exact bytes of a safetensors file. Throws ConfigError on
// an empty or duplicate name, a name "__metadata__", a negative dimension or
// a null data pointer with a nonzero size.
std::string safetensors_bytes(const std::vector<NamedTensorView>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes `path` (through a temporary file renamed into place, so a failed
// write never leaves half a checkpoint). Throws ConfigError("`save_path` ...")
// when the file cannot be written.
void save_safetensors(const std::string& path, const std::vector<NamedTensorView>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Parses the bytes of a file; `origin` names it in error messages.
SafetensorsFile parse_safetensors(std::span<const uint8_t> bytes, const std::string& origin);

// Reads and parses `path`. Throws ConfigError on a missing or corrupt file.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace shardlab::model
