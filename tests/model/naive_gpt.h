// An independent, deliberately naive GPT forward (plain loops, double), used
// to check the model's forward. It shares nothing with model/ but the config
// and the parameter names.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/kernels.h"

namespace shardlab::model::testing {

// Returns a tensor's values by nanoGPT name.
using ParamLookup = std::function<const double*(const std::string& name)>;

struct NaiveResult {
  double loss = 0;  // CE + aux_coef · Σ aux
  double ce = 0;
  double aux = 0;              // Σ over MoE layers
  std::vector<double> logits;  // (B,T,V)
};

NaiveResult naive_gpt_forward(const GPTConfig& config, const ParamLookup& param,
                              const std::vector<Token>& inputs, const std::vector<Token>& targets,
                              int B, int T);

}  // namespace shardlab::model::testing
