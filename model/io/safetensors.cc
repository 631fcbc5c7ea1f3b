#include "model/io/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <tuple>

#include "runtime/errors.h"
#include "runtime/input_file.h"
#include "runtime/output_file.h"

namespace shardlab::model {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the Python reader's limit
constexpr const char* kMetadataKey = "__metadata__";

[[noreturn]] void corrupt(const std::string& origin, const std::string& what) {
  throw ConfigError(fmt::format("safetensors \"{}\": {}", origin, what));
}

void put_u64_le(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void put_f32_le(std::string& out, const float* src, int64_t n) {
  size_t at = out.size();
  out.resize(at + static_cast<size_t>(n) * 4);
  char* dst = out.data() + at;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = std::bit_cast<uint32_t>(src[i]);
    for (int b = 0; b < 4; ++b) *dst++ = static_cast<char>((bits >> (8 * b)) & 0xff);
  }
}

void get_f32_le(float* dst, const uint8_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i, src += 4) {
    uint32_t bits =
        uint32_t{src[0]} | uint32_t{src[1]} << 8 | uint32_t{src[2]} << 16 | uint32_t{src[3]} << 24;
    dst[i] = std::bit_cast<float>(bits);
  }
}

// A JSON value that must be a non-negative integer that fits int64.
int64_t get_index(const json& v, const std::string& origin, const std::string& what) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      corrupt(origin, fmt::format("{} is out of range ({})", what, u));
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer())
    corrupt(origin, fmt::format("{} is negative ({})", what, v.get<int64_t>()));
  corrupt(origin, fmt::format("{} is not an integer (got {})", what, v.dump()));
}

struct Entry {
  std::string name;
  Shape shape;
  int64_t begin = 0, end = 0;
};

// Validates one tensor entry against a data section of `data_size` bytes.
Entry parse_entry(const std::string& name, const json& e, int64_t data_size,
                  const std::string& origin) {
  std::string t = fmt::format("tensor \"{}\"", name);
  if (!e.is_object()) corrupt(origin, t + ": entry is not a JSON object");
  if (!e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
    corrupt(origin, t + ": entry needs \"dtype\", \"shape\" and \"data_offsets\"");
  const json& dtype = e["dtype"];
  if (!dtype.is_string()) corrupt(origin, t + ": dtype is not a string");
  if (dtype.get<std::string>() != "F32")
    corrupt(origin, fmt::format("{} has dtype {}, which is unsupported (shardlab reads F32 only)",
                                t, dtype.get<std::string>()));
  Entry out{name, {}, 0, 0};
  const json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    corrupt(origin, t + ": data_offsets is not an array [begin, end]");
  out.begin = get_index(off[0], origin, t + ": data_offsets begin");
  out.end = get_index(off[1], origin, t + ": data_offsets end");
  if (out.begin > out.end)
    corrupt(origin,
            fmt::format("{}: data_offsets [{}, {}] end before they begin", t, out.begin, out.end));
  if (out.end > data_size)
    corrupt(origin, fmt::format("{}: data_offsets [{}, {}] run past the data section ({} bytes): "
                                "file truncated?",
                                t, out.begin, out.end, data_size));
  const json& shape = e["shape"];
  if (!shape.is_array()) corrupt(origin, t + ": shape is not an array");
  const int64_t held = out.end - out.begin;
  constexpr int64_t kMaxNumel = std::numeric_limits<int64_t>::max() / 4;
  int64_t numel = 1;  // kept <= kMaxNumel, so numel * 4 cannot overflow
  for (const json& d : shape) {
    int64_t dim = get_index(d, origin, t + ": shape dimension");
    out.shape.push_back(dim);
    if (numel != 0 && dim > kMaxNumel / numel)
      corrupt(origin, fmt::format("{}: shape {} is absurdly large (data_offsets [{}, {}] hold {} "
                                  "bytes)",
                                  t, shape.dump(), out.begin, out.end, held));
    numel *= dim;
  }
  if (held != numel * 4)
    corrupt(origin, fmt::format("{}: data_offsets [{}, {}] hold {} bytes but shape {} in F32 "
                                "needs {}",
                                t, out.begin, out.end, held, shape_string(out.shape), numel * 4));
  return out;
}

std::map<std::string, std::string> parse_metadata(const json& m, const std::string& origin) {
  if (!m.is_object()) corrupt(origin, "__metadata__ is not a JSON object");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : m.items()) {
    if (!value.is_string())
      corrupt(origin, fmt::format("__metadata__ value of \"{}\" is not a string", key));
    out[key] = value.get<std::string>();
  }
  return out;
}

// Tensors must tile the data section exactly: no overlap, no gap, no tail.
void check_layout(std::vector<Entry>& entries, int64_t data_size, const std::string& origin) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  int64_t at = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < at)
      corrupt(origin, fmt::format("tensors \"{}\" and \"{}\" overlap (data_offsets [{}, {}] and "
                                  "[{}, {}])",
                                  prev->name, e.name, prev->begin, prev->end, e.begin, e.end));
    if (e.begin > at)
      corrupt(origin, fmt::format("bytes [{}, {}) of the data section belong to no tensor "
                                  "(before \"{}\")",
                                  at, e.begin, e.name));
    at = e.end;
    prev = &e;
  }
  if (at != data_size)
    corrupt(origin, fmt::format("{} bytes after the last tensor (data section {} bytes, tensors "
                                "end at {})",
                                data_size - at, data_size, at));
}

}  // namespace

SafetensorsFile::SafetensorsFile(std::string origin, std::map<std::string, LoadedTensor> tensors,
                                 std::map<std::string, std::string> metadata)
    : origin_(std::move(origin)), tensors_(std::move(tensors)), metadata_(std::move(metadata)) {}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

const LoadedTensor& SafetensorsFile::at(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw ConfigError(fmt::format("safetensors \"{}\": missing tensor \"{}\" ({} tensors in file)",
                                  origin_, name, tensors_.size()));
  return it->second;
}

std::span<const float> SafetensorsFile::get(const std::string& name, const Shape& expected) const {
  const LoadedTensor& t = at(name);
  if (t.shape != expected)
    throw ConfigError(fmt::format("safetensors \"{}\": tensor \"{}\" has shape {}, expected {}",
                                  origin_, name, shape_string(t.shape), shape_string(expected)));
  return t.data;
}

std::string safetensors_bytes(const std::vector<NamedTensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::map<std::string, const NamedTensorView*> sorted;
  for (const NamedTensorView& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey)
      throw ConfigError(fmt::format("safetensors: invalid tensor name \"{}\"", t.name));
    for (int64_t d : t.shape)
      if (d < 0)
        throw ConfigError(fmt::format("safetensors: tensor \"{}\" has negative shape {}", t.name,
                                      shape_string(t.shape)));
    if (t.data == nullptr && shape_numel(t.shape) != 0)
      throw ConfigError(fmt::format("safetensors: tensor \"{}\" has no data", t.name));
    if (!sorted.emplace(t.name, &t).second)
      throw ConfigError(fmt::format("safetensors: duplicate tensor name \"{}\"", t.name));
  }
  // ordered_json keeps the Python writer's order: __metadata__, then sorted names.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  int64_t at = 0;
  for (const auto& [name, t] : sorted) {
    int64_t bytes = shape_numel(t->shape) * 4;
    header[name] = {{"dtype", "F32"}, {"shape", t->shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data starts 8-aligned
  std::string out;
  out.reserve(8 + text.size() + static_cast<size_t>(at));
  put_u64_le(out, text.size());
  out += text;
  for (const auto& [name, t] : sorted) put_f32_le(out, t->data, shape_numel(t->shape));
  return out;
}

void save_safetensors(const std::string& path, const std::vector<NamedTensorView>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, safetensors_bytes(tensors, metadata), "`save_path`");
}

SafetensorsFile parse_safetensors(std::span<const uint8_t> bytes, const std::string& origin) {
  if (bytes.size() < 8)
    corrupt(origin, fmt::format("truncated: {} bytes, shorter than the 8-byte header length",
                                bytes.size()));
  uint64_t header_len = get_u64_le(bytes.data());
  uint64_t rest = bytes.size() - 8;
  if (header_len > rest)
    corrupt(origin, fmt::format("truncated: header length {} is beyond the {} bytes that follow",
                                header_len, rest));
  if (header_len > kMaxHeaderBytes)
    corrupt(origin, fmt::format("header length {} is over the 100 MiB limit", header_len));
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  json header;
  try {
    header = json::parse(text, text + header_len);  // nlohmann 3.11 parses without recursion
  } catch (const json::exception& e) {
    corrupt(origin, fmt::format("header is not valid JSON ({})", e.what()));
  }
  if (!header.is_object())
    corrupt(origin, fmt::format("header is not a JSON object (got {})", header.type_name()));
  const int64_t data_size = static_cast<int64_t>(rest - header_len);
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      metadata = parse_metadata(value, origin);
    } else {
      entries.push_back(parse_entry(name, value, data_size, origin));
    }
  }
  check_layout(entries, data_size, origin);
  const uint8_t* data = bytes.data() + 8 + header_len;
  std::map<std::string, LoadedTensor> tensors;
  for (const Entry& e : entries) {
    LoadedTensor t{e.shape, std::vector<float>(static_cast<size_t>((e.end - e.begin) / 4))};
    get_f32_le(t.data.data(), data + e.begin, static_cast<int64_t>(t.data.size()));
    tensors.emplace(e.name, std::move(t));
  }
  return SafetensorsFile(origin, std::move(tensors), std::move(metadata));
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in = open_input(fmt::format("safetensors \"{}\"", path), path, "a .safetensors file");
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0) throw ConfigError(fmt::format("safetensors \"{}\": cannot read", path));
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.read(reinterpret_cast<char*>(bytes.data()), size);
  if (in.gcount() != size) throw ConfigError(fmt::format("safetensors \"{}\": read failed", path));
  return parse_safetensors(bytes, path);
}

}  // namespace shardlab::model
