#include "model/parallel/recompute.h"

#include <string>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace shardlab::parallel {

Recompute parse_recompute(std::string_view name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  throw ConfigError(fmt::format("`recompute` \"{}\": expected none, selective or full", name));
}

const char* recompute_name(Recompute r) {
  return r == Recompute::kFull ? "full" : r == Recompute::kSelective ? "selective" : "none";
}

RecomputeMethod parse_recompute_method(std::string_view name) {
  if (name == "uniform") return RecomputeMethod::kUniform;
  if (name == "block") return RecomputeMethod::kBlock;
  throw ConfigError(fmt::format("`recompute_method` \"{}\": expected uniform or block", name));
}

const char* recompute_method_name(RecomputeMethod m) { return m == RecomputeMethod::kBlock ? "block" : "uniform"; }

namespace {

struct ModuleName {
  RecomputeModule module;
  const char* name;
};
constexpr ModuleName kModules[] = {
    {kRecomputeCoreAttn, "core_attn"}, {kRecomputeLayerNorm, "layernorm"}, {kRecomputeMlp, "mlp"},
    {kRecomputeMoe, "moe"},           {kRecomputeMoeAct, "moe_act"},      {kRecomputeSharedExperts, "shared_experts"},
    {kRecomputeMlaUpProj, "mla_up_proj"},
};

}  // namespace

unsigned parse_recompute_modules(std::string_view list) {
  unsigned modules = 0;
  size_t start = 0;
  while (true) {
    const size_t comma = list.find_first_of(",+", start);  // '+' too: a sweep's value cannot hold a comma
    const std::string_view name = list.substr(start, comma == std::string_view::npos ? list.npos : comma - start);
    const ModuleName* found = nullptr;
    for (const ModuleName& m : kModules)
      if (name == m.name) found = &m;
    if (!found)
      throw ConfigError(fmt::format("`recompute_modules` \"{}\": \"{}\" is not one of core_attn, layernorm, mlp, "
                                    "moe, moe_act, shared_experts, mla_up_proj (a list separated by , or +)",
                                    list, name));
    if (modules & found->module)
      throw ConfigError(fmt::format("`recompute_modules` \"{}\": {} is listed twice", list, name));
    modules |= found->module;
    if (comma == std::string_view::npos) return modules;
    start = comma + 1;
  }
}

std::string recompute_modules_name(unsigned modules) {
  std::string out;
  for (const ModuleName& m : kModules)
    if (modules & m.module) out += fmt::format("{}{}", out.empty() ? "" : ",", m.name);
  return out;
}

}  // namespace shardlab::parallel
