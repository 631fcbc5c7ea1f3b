// The replay driver: a plain main() for a fuzz harness, so the normal (g++)
// build runs the committed corpus through the same LLVMFuzzerTestOneInput
// as libFuzzer does. Arguments are files or folders (every regular file in
// them, sorted). Exit 0 when every input passed (a finding aborts), 1 when
// there was nothing to replay.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::filesystem::path> inputs_of(const std::filesystem::path& arg) {
  std::vector<std::filesystem::path> out;
  if (std::filesystem::is_directory(arg)) {
    for (const auto& e : std::filesystem::directory_iterator(arg))
      if (e.is_regular_file()) out.push_back(e.path());
    std::sort(out.begin(), out.end());
  } else if (std::filesystem::is_regular_file(arg)) {
    out.push_back(arg);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  size_t replayed = 0;
  for (int i = 1; i < argc; ++i) {
    for (const auto& path : inputs_of(argv[i])) {
      std::ifstream in(path, std::ios::binary);
      const std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
      std::fprintf(stderr, "replay %s (%zu bytes)\n", path.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
    }
  }
  if (replayed == 0) {
    std::fprintf(stderr, "replay: no inputs in the given files or folders\n");
    return 1;
  }
  std::printf("replayed %zu inputs, no finding\n", replayed);
  return 0;
}
