// TensorBoard event files (train/tensorboard.h): what the writer writes, our reader reads back
// exactly (tags, steps, values, the file version), and a damaged file is an error naming the file
// and the offset. tests/cli/tensorboard_test.sh reads a training run's file with TensorBoard's own
// reader when the Python package is installed.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include "engine/core/crc32c.h"
#include "engine/core/error.h"
#include "tests/test_util.h"
#include "train/tensorboard.h"

using namespace llmt;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

TEST(TensorBoard, ScalarsReadBackExactly) {
  llmt_test::TempDir tmp("tb");
  const std::string dir = tmp.path + "/runs/a";
  std::string path;
  {
    TensorBoardWriter w(dir);
    path = w.path();
    w.add_scalars(1, {{"train/loss", 5.25}, {"train/learning_rate", 3e-4}});
    w.add_scalars(2, {{"train/loss", 4.5}});
    w.add_scalars(10, {{"eval/loss", 4.0}, {"eval/perplexity", 54.598150033144236}});
  }
  EXPECT_EQ(path.rfind(dir + "/events.out.tfevents.", 0), 0u) << path;
  const TbFile f = read_tensorboard_file(path);
  EXPECT_EQ(f.file_version, "brain.Event:2");
  ASSERT_EQ(f.scalars.size(), 5u);
  EXPECT_EQ(f.scalars[0].tag, "train/loss");
  EXPECT_EQ(f.scalars[0].step, 1);
  EXPECT_EQ(f.scalars[0].value, 5.25f);
  EXPECT_EQ(f.scalars[1].tag, "train/learning_rate");
  EXPECT_EQ(f.scalars[1].value, 3e-4f);
  EXPECT_EQ(f.scalars[2].step, 2);
  EXPECT_EQ(f.scalars[4].tag, "eval/perplexity");
  EXPECT_EQ(f.scalars[4].step, 10);
  EXPECT_EQ(f.scalars[4].value, 54.598150033144236f);
  EXPECT_GT(f.scalars[0].wall_time, 1.7e9);  // seconds since 1970, not a step or a zero
}

// The framing's checksum is CRC-32C, masked as TFRecord masks it: a known vector, then damage.
TEST(TensorBoard, DamagedFilesAreErrorsNamingTheOffset) {
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u);  // the CRC-32C check value (RFC 3720)
  llmt_test::TempDir tmp("tb");
  const std::string dir = tmp.path + "/runs/b";
  std::string path;
  {
    TensorBoardWriter w(dir);
    path = w.path();
    w.add_scalars(1, {{"train/loss", 5.0}});
  }
  const std::string good = read_bytes(path);
  std::string bad = good;
  bad[bad.size() - 6] ^= 0x01;  // a byte of the last record's data
  write_bytes(path, bad);
  llmt_test::expect_error([&] { read_tensorboard_file(path); }, {path, "the record's data fails its CRC"});
  bad = good;
  bad[2] ^= 0x40;  // the first record's length
  write_bytes(path, bad);
  llmt_test::expect_error([&] { read_tensorboard_file(path); }, {path, "offset 0: the record length fails its CRC"});
  write_bytes(path, good.substr(0, good.size() - 3));  // a run that died mid-write
  llmt_test::expect_error([&] { read_tensorboard_file(path); }, {path, "runs past the end of the file"});
}

TEST(TensorBoard, TagsAndTheDefaultDirectoryFollowTheTrainer) {
  EXPECT_EQ(tensorboard_tag("loss"), "train/loss");
  EXPECT_EQ(tensorboard_tag("learning_rate"), "train/learning_rate");
  EXPECT_EQ(tensorboard_tag("eval_loss"), "eval/loss");
  EXPECT_EQ(tensorboard_tag("test_loss"), "test/loss");
  const std::string d = default_logging_dir("out/run");
  EXPECT_TRUE(std::regex_match(d, std::regex("out/run/runs/[A-Z][a-z][a-z][0-9]{2}_[0-9]{2}-[0-9]{2}-[0-9]{2}_.+")))
      << d;
}
