// The model block of reports and checkpoints (model/engine/model_json.h):
// what it records for each family, and which differences a checkpoint's
// block refuses before any tensor is read.
#include <gtest/gtest.h>

#include "model/config.h"
#include "model/engine/model_json.h"
#include "runtime/errors.h"

namespace shardlab::engine {
namespace {

TEST(ModelJson, RecordsTheFamilyAndItsKnobs) {
  const model::GPTConfig llama = model::preset("tiny-llama");
  const nlohmann::json j = model_json(llama);
  EXPECT_EQ(j.at("family"), "llama");
  EXPECT_EQ(j.at("kv_heads"), llama.n_kv_head);  // grouped-query: fewer than the heads
  EXPECT_LT(j.at("kv_heads").get<int>(), j.at("heads").get<int>());
  EXPECT_EQ(j.at("rope_theta"), llama.rope_theta);
  EXPECT_EQ(j.at("norm_eps"), llama.norm_eps);
  EXPECT_EQ(j.at("tie_embeddings"), false);

  const nlohmann::json g = model_json(model::preset("tiny"));
  EXPECT_EQ(g.at("family"), "gpt");
  EXPECT_EQ(g.at("kv_heads"), g.at("heads"));  // multi-head: one K/V head per query head
  EXPECT_EQ(g.at("tie_embeddings"), true);
  EXPECT_FALSE(g.contains("rope_theta"));  // learned positions
}

TEST(ModelJson, ACheckpointOfAnotherFamilyOrKvHeadsIsRefused) {
  const model::GPTConfig llama = model::preset("tiny-llama");
  nlohmann::json saved = model_json(llama);
  EXPECT_NO_THROW(check_model_json(saved, llama, "ckpt"));

  model::GPTConfig gpt = llama;
  gpt.family = model::Family::kGpt;
  gpt.n_kv_head = 0;
  saved["kv_heads"] = gpt.n_head;  // only the family differs
  try {
    check_model_json(saved, gpt, "ckpt");
    ADD_FAILURE() << "a llama checkpoint accepted by a gpt run";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "ckpt: the checkpoint has `family` llama, this run gpt");
  }

  model::GPTConfig mha = llama;
  mha.n_kv_head = 0;  // 4 K/V heads against the checkpoint's 2
  saved = model_json(llama);
  try {
    check_model_json(saved, mha, "ckpt");
    ADD_FAILURE() << "2 K/V heads accepted by a run with 4";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "ckpt: the checkpoint has `n_kv_head` 2, this run 4");
  }

  // A block written before the family and K/V heads were recorded: taken as this run's.
  saved.erase("family");
  saved.erase("kv_heads");
  EXPECT_NO_THROW(check_model_json(saved, mha, "ckpt"));
}

}  // namespace
}  // namespace shardlab::engine
