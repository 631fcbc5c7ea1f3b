// Sweep grids: --vary parsing, the product of the axes, point labels.
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "model/sweep/sweep.h"
#include "runtime/errors.h"
#include "runtime/text.h"

namespace shardlab::sweep {
namespace {

// A flag name as the axis spells it: lower-case letters, digits and inner dashes.
void check_name(const std::string& vary, const std::string& name) {
  const bool ok = !name.empty() && name.front() != '-' && name.back() != '-' &&
                  std::all_of(name.begin(), name.end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
                  });
  if (!ok)
    throw ConfigError(fmt::format("`vary` \"{}\": \"{}\" is not a flag name (a train flag without its dashes, "
                                  "e.g. batch or micro-batches)", vary, name));
}

void check_value(const std::string& vary, const std::string& flag, const std::string& value) {
  if (value.empty()) throw ConfigError(fmt::format("`vary` \"{}\": {} has an empty value", vary, flag));
  if (value.find_first_of(" \t\n\"") != std::string::npos)
    throw ConfigError(fmt::format("`vary` \"{}\": value \"{}\" of {} has a space or a quote", vary, value, flag));
}

Axis parse_plain(const std::string& text, size_t eq) {
  Axis axis;
  axis.name = text.substr(0, eq);
  check_name(text, axis.name);
  axis.flags = {axis.name};
  for (const std::string& v : split<std::string>(text.substr(eq + 1), ',')) {
    check_value(text, axis.name, v);
    for (const AxisValue& seen : axis.values)
      if (seen.label == v) throw ConfigError(fmt::format("`vary` \"{}\": value {} appears twice", text, v));
    axis.values.push_back({v, {{axis.name, v}}});
  }
  return axis;
}

// One value of a tied axis: "tp=8,pp=1".
std::vector<Setting> parse_tied_value(const std::string& text, const std::string& value) {
  std::vector<Setting> settings;
  for (const std::string& pair : split<std::string>(value, ',')) {
    const size_t eq = pair.find('=');
    if (eq == std::string::npos || pair.find('=', eq + 1) != std::string::npos)
      throw ConfigError(fmt::format("`vary` \"{}\": \"{}\" is not FLAG=VALUE (tied values are "
                                    "'a=1,b=2|a=2,b=1')", text, pair));
    Setting s{pair.substr(0, eq), pair.substr(eq + 1)};
    check_name(text, s.flag);
    check_value(text, s.flag, s.value);
    for (const Setting& seen : settings)
      if (seen.flag == s.flag) throw ConfigError(fmt::format("`vary` \"{}\": {} is set twice in \"{}\"", text, s.flag, value));
    settings.push_back(s);
  }
  return settings;
}

Axis parse_tied(const std::string& text) {
  Axis axis;
  for (const std::string& value : split<std::string>(text, '|')) {
    std::vector<Setting> settings = parse_tied_value(text, value);
    if (axis.values.empty()) {
      for (const Setting& s : settings) axis.flags.push_back(s.flag);
    } else {
      // Every value sets the same flags; keep the first value's order.
      std::map<std::string, std::string> by_flag;
      for (const Setting& s : settings) by_flag[s.flag] = s.value;
      if (by_flag.size() != axis.flags.size() ||
          !std::all_of(axis.flags.begin(), axis.flags.end(), [&](const auto& f) { return by_flag.count(f); }))
        throw ConfigError(fmt::format("`vary` \"{}\": \"{}\" does not set the same flags as \"{}\"", text, value,
                                      axis.values.front().label));
      settings.clear();
      for (const std::string& f : axis.flags) settings.push_back({f, by_flag[f]});
    }
    std::string label;
    for (const Setting& s : settings) label += fmt::format("{}{}={}", label.empty() ? "" : ",", s.flag, s.value);
    for (const AxisValue& seen : axis.values)
      if (seen.label == label) throw ConfigError(fmt::format("`vary` \"{}\": {} appears twice", text, label));
    axis.values.push_back({label, settings});
  }
  for (const std::string& f : axis.flags) axis.name += (axis.name.empty() ? "" : ",") + f;
  return axis;
}

}  // namespace

Axis parse_axis(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos)
    throw ConfigError(fmt::format("`vary` \"{}\": expected NAME=V1,V2,... or 'a=1,b=2|a=2,b=1'", text));
  const bool tied = text.find('|') != std::string::npos || text.find('=', eq + 1) != std::string::npos;
  return tied ? parse_tied(text) : parse_plain(text, eq);
}

void check_distinct_flags(const std::vector<Axis>& axes) {
  std::map<std::string, size_t> owner;
  for (size_t a = 0; a < axes.size(); ++a) {
    for (const std::string& f : axes[a].flags) {
      const auto [it, fresh] = owner.emplace(f, a);
      if (!fresh)
        throw ConfigError(fmt::format("`vary`: {} is varied by two axes (\"{}\" and \"{}\")", f,
                                      axes[it->second].name, axes[a].name));
    }
  }
}

std::vector<GridPoint> expand_grid(const std::vector<Axis>& axes) {
  size_t total = axes.empty() ? 0 : 1;
  for (const Axis& a : axes) total *= a.values.size();
  std::vector<GridPoint> grid;
  grid.reserve(total);
  for (size_t n = 0; n < total; ++n) {
    GridPoint p;
    size_t rest = n;  // mixed-radix digits, the first axis the fastest
    for (const Axis& a : axes) {
      p.index.push_back(rest % a.values.size());
      rest /= a.values.size();
      for (const Setting& s : a.values[p.index.back()].settings) p.settings.push_back(s);
    }
    grid.push_back(std::move(p));
  }
  return grid;
}

std::string point_label(const std::vector<Axis>& axes, const GridPoint& point) {
  std::string out;
  for (size_t a = 0; a < axes.size(); ++a) {
    const AxisValue& v = axes[a].values[point.index[a]];
    out += (out.empty() ? "" : " ") + (axes[a].tied() ? v.label : axes[a].name + "=" + v.label);
  }
  return out;
}

std::string axis_title(const std::string& flag) {
  static const std::map<std::string, std::string> titles = {
      {"batch", "global batch (sequences)"},
      {"micro-batches", "micro-batches per step"},
      {"seq", "sequence length (tokens)"},
      {"layers", "transformer blocks"},
      {"embd", "embedding width (channels)"},
      {"heads", "attention heads"},
      {"tp", "tensor-parallel degree (GPUs)"},
      {"pp", "pipeline stages (GPUs)"},
      {"dp", "data-parallel degree (GPUs)"},
      {"ep", "expert-parallel degree (GPUs)"},
      {"cp", "context-parallel degree (GPUs)"},
      {"nodes", "nodes"},
      {"experts", "experts per MoE block"},
      {"bucket-mb", "gradient bucket (MB)"},
      {"vpp", "model chunks per pipeline rank"},
      {"profile", "hardware profile"},
  };
  const auto it = titles.find(flag);
  return it != titles.end() ? it->second : "--" + flag;
}

}  // namespace shardlab::sweep
