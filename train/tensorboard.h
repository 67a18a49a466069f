// TensorBoard event files, written natively (no TensorFlow, no protobuf library): --report_to
// tensorboard writes the logged scalars where TensorBoard looks for them, under the tag names the
// Hugging Face Trainer uses (train/loss, train/learning_rate, eval/loss, ...).
//
// The format: a file of records, each
//   u64 length (little-endian), u32 masked CRC-32C of those 8 bytes, the data, u32 masked CRC-32C of
//   the data; masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8
// (TFRecord framing, tensorflow/core/lib/io/record_writer.cc). Each record's data is a serialized
// tensorflow.Event (event.proto): wall_time = 1 (double), step = 2 (int64), file_version = 3 (string,
// the first event: "brain.Event:2"), summary = 5 (Summary: repeated Value value = 1; Value: tag = 1
// (string), simple_value = 2 (float)).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace llmt {

// Hugging Face's default --logging_dir: <output_dir>/runs/<Mon><DD>_<HH>-<MM>-<SS>_<host>
std::string default_logging_dir(const std::string& output_dir);

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and events.out.tfevents.<unix time>.<host>.<pid>.0 in it.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event holding these scalars at `step`, flushed to the file at once, so a run that dies keeps
  // its curve. Throws naming the file when the write fails (a full disk).
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }
  // Closes the file; throws naming it when that fails (the destructor closes silently).
  void close();

 private:
  void write_record(const std::string& data);
  std::string path_;
  FILE* f_ = nullptr;
};

// What a file holds, for tests and tools: every scalar of every event, in file order. Checks both
// CRCs of every record; a bad or truncated record is an error naming the file and the offset.
struct TbScalar {
  int64_t step = 0;
  double wall_time = 0;
  std::string tag;
  float value = 0;
};
struct TbFile {
  std::string file_version;  // the first event's
  std::vector<TbScalar> scalars;
};
TbFile read_tensorboard_file(const std::string& path);

// HF's rewrite_logs: a logged key becomes "eval/<rest>" for eval_<rest>, "test/<rest>" for test_<rest>,
// else "train/<key>".
std::string tensorboard_tag(const std::string& key);

}  // namespace llmt
