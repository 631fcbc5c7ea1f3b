#include "model/config.h"

#include <sstream>

#include "runtime/errors.h"

namespace shardlab::model {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw ConfigError(message);
}

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

void GPTConfig::validate() const {
  require(n_layer >= 1, "--layers must be at least 1 (got " + num(n_layer) + ")");
  require(n_head >= 1, "--heads must be at least 1 (got " + num(n_head) + ")");
  require(n_embd >= 1, "--embd must be at least 1 (got " + num(n_embd) + ")");
  require(n_embd % n_head == 0, "--heads " + num(n_head) + " must divide --embd " + num(n_embd) +
                                    " (head size = embd / heads)");
  require(block_size >= 1, "--seq must be at least 1 (got " + num(block_size) + ")");
  require(vocab_size >= 2, "--vocab must be at least 2 (got " + num(vocab_size) + ")");
  require(batch_size >= 1, "--batch must be at least 1 (got " + num(batch_size) + ")");
  require(n_expert >= 0, "--experts must be 0 (dense) or more (got " + num(n_expert) + ")");
  if (n_expert == 0) return;
  require(top_k >= 1 && top_k <= n_expert,
          "--top-k " + num(top_k) + " must be between 1 and --experts " + num(n_expert));
  require(moe_every >= 1, "--moe-every must be at least 1 (got " + num(moe_every) + ")");
  require(aux_coef >= 0, "--aux-coef must be >= 0 (got " + num(aux_coef) + ")");
  require(capacity_factor >= 0,
          "--capacity-factor must be >= 0, 0 = off (got " + num(capacity_factor) + ")");
}

std::string GPTConfig::to_string() const {
  std::ostringstream os;
  os << "layers=" << n_layer << " heads=" << n_head << " embd=" << n_embd << " seq=" << block_size
     << " vocab=" << vocab_size << " batch=" << batch_size;
  if (is_moe()) {
    os << " experts=" << n_expert << " top_k=" << top_k << " moe_every=" << moe_every
       << " aux_coef=" << aux_coef << " capacity_factor=" << capacity_factor;
  }
  return os.str();
}

GPTConfig preset(std::string_view name) {
  GPTConfig c;  // defaults are tiny
  if (name == "tiny") return c;
  if (name == "nano") {
    c.n_layer = 2, c.n_head = 2, c.n_embd = 64, c.block_size = 32, c.vocab_size = 256;
    c.batch_size = 4;
    return c;
  }
  if (name == "small") {
    c.n_layer = 6, c.n_head = 6, c.n_embd = 384, c.block_size = 256, c.vocab_size = 4096;
    c.batch_size = 16;
    return c;
  }
  throw ConfigError("--model: unknown preset '" + std::string(name) +
                    "' (choose nano, tiny or small)");
}

std::vector<std::string> preset_names() { return {"nano", "tiny", "small"}; }

}  // namespace shardlab::model
