// config_diff (engine/ckpt/train_state.h): what a resume compares between the config.json saved in a
// checkpoint and the run's own. Keys of how it was saved and the special tokens' ids do not count:
// llmt before 2026-12-07 dropped an eos_token_id list (Llama 3.1/3.2 Instruct's), so a checkpoint it
// wrote lacks the list the same model now carries, and must still resume.
#include <gtest/gtest.h>

#include "engine/ckpt/train_state.h"

namespace llmt {
namespace {

TEST(ConfigDiff, AnEosListTheOldCheckpointLacksDoesNotBlockTheResume) {
  const std::string saved = R"({"model_type": "llama", "hidden_size": 64, "torch_dtype": "float32"})";
  const std::string now =
      R"({"model_type": "llama", "hidden_size": 64, "torch_dtype": "bfloat16", "eos_token_id": [128001, 128008, 128009],
          "bos_token_id": 128000})";
  EXPECT_EQ(config_diff(saved, now), "");
}

TEST(ConfigDiff, AKeyThatChangesTheModelIsNamed) {
  const std::string saved = R"({"model_type": "llama", "hidden_size": 64, "eos_token_id": 2})";
  const std::string now = R"({"model_type": "llama", "hidden_size": 128, "eos_token_id": [2, 3]})";
  EXPECT_EQ(config_diff(saved, now), "hidden_size 64 in the file, 128 here");
}

}  // namespace
}  // namespace llmt
