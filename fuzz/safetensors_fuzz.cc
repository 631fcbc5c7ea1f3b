// The safetensors reader (model/io/safetensors.h), as --init and verify use
// it: load_safetensors on a file holding the input. Accepted files must be
// self-consistent and survive a write/read round trip bit for bit.
#include <cstring>

#include "fuzz/fuzz_util.h"
#include "model/io/safetensors.h"
#include "runtime/errors.h"

namespace {

using shardlab::model::LoadedTensor;
using shardlab::model::NamedTensorView;
using shardlab::model::SafetensorsFile;

// What the header promises: every tensor's data is its shape's size, and all
// of them fit in the file that held them.
void check_accepted(const SafetensorsFile& f, size_t file_size) {
  size_t floats = 0;
  for (const std::string& name : f.names()) {
    const LoadedTensor& t = f.at(name);
    if (static_cast<int64_t>(t.data.size()) != shardlab::shape_numel(t.shape))
      shardlab::fuzz::finding("tensor \"" + name + "\": data size differs from its shape");
    floats += t.data.size();
  }
  if (floats * 4 + 8 > file_size) shardlab::fuzz::finding("tensors hold more bytes than the file");
}

// Written back (when the writer takes the names) and read again, the file
// holds the same tensors, bit for bit, and the same metadata.
void check_round_trip(const SafetensorsFile& f) {
  std::vector<NamedTensorView> views;
  for (const std::string& name : f.names()) views.push_back({name, f.at(name).shape, f.at(name).data.data()});
  std::string bytes;
  try {
    bytes = shardlab::model::safetensors_bytes(views, f.metadata());
  } catch (const shardlab::ConfigError&) {
    return;  // a name the writer refuses ("" is legal JSON but no tensor name)
  }
  SafetensorsFile again;
  try {
    again = shardlab::model::parse_safetensors(
        {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "round trip");
  } catch (const shardlab::ConfigError& e) {
    shardlab::fuzz::finding(std::string("the reader refuses what the writer wrote: ") + e.what());
  }
  if (again.names() != f.names() || again.metadata() != f.metadata())
    shardlab::fuzz::finding("round trip changed the names or the metadata");
  for (const std::string& name : f.names()) {
    const LoadedTensor &a = f.at(name), &b = again.at(name);
    if (a.shape != b.shape || a.data.size() != b.data.size() ||
        (!a.data.empty() && std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(float)) != 0))
      shardlab::fuzz::finding("round trip changed tensor \"" + name + "\"");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static shardlab::fuzz::MemFile file;
  try {
    const SafetensorsFile f = shardlab::model::load_safetensors(file.write(data, size));
    check_accepted(f, size);
    check_round_trip(f);
  } catch (const shardlab::ConfigError&) {
    // A corrupt file: the expected outcome, one line naming the problem.
  }
  return 0;
}
