#include "engine/formats/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "tests/test_util.h"

using namespace llmt;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string dir;
  void SetUp() override {
    char tmpl[] = "/tmp/llmt_st_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string at(const std::string& name) const { return dir + "/" + name; }
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), (std::streamsize)bytes.size());
}

// A safetensors file by hand: length (the header's own unless given), header, data.
void write_raw(const std::string& path, const std::string& header, const std::string& data, int64_t hlen = -1) {
  uint64_t n = hlen < 0 ? header.size() : (uint64_t)hlen;
  std::string s(8, '\0');
  for (int i = 0; i < 8; i++) s[i] = (char)(n >> (8 * i));
  spit(path, s + header + data);
}

using llmt_test::expect_error;

// A file with one bad header, opened as a SafetensorsFile: the error names the file and the parts.
void expect_open_error(const std::string& path, const std::string& header, const std::string& data,
                       std::vector<std::string> parts) {
  write_raw(path, header, data);
  parts.push_back(path);
  expect_error([&] { SafetensorsFile f(path); }, parts);
}

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = scale * ((float)i - (float)n / 3) + 0.125f;
  return v;
}

}  // namespace

TEST_F(SafetensorsTest, RoundTripDtypes) {
  std::vector<float> a = ramp(6, 0.37f);
  std::vector<float> bsrc = ramp(5, -1.93f), csrc = ramp(3, 2.71f);
  std::vector<uint16_t> b(5), c(3);
  for (size_t i = 0; i < b.size(); i++) b[i] = f32_to_bf16(bsrc[i]);
  for (size_t i = 0; i < c.size(); i++) c[i] = f32_to_f16(csrc[i]);
  std::vector<int32_t> ids = {7, -1, 1 << 30};
  float scalar = 42.5f;
  std::string path = at("t.safetensors");
  write_safetensors(path, {{"w.bf16", "BF16", {5}, b.data()},
                           {"w.f16", "F16", {1, 3}, c.data()},
                           {"w.f32", "F32", {2, 3}, a.data()},
                           {"ids", "I32", {3}, ids.data()},
                           {"scalar", "F32", {}, &scalar},
                           {"empty", "F32", {0, 4}, nullptr}});

  SafetensorsFile f(path);
  EXPECT_EQ(f.path(), path);
  ASSERT_EQ(f.tensors().size(), 6u);
  EXPECT_EQ(f.find("missing"), nullptr);

  const StTensor* t = f.find("w.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, "F32");
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->numel(), 6);
  EXPECT_EQ(0, memcmp(f.data(*t), a.data(), 24));
  std::vector<float> out(6);
  f.read_f32(*t, out.data());
  EXPECT_EQ(out, a);

  t = f.find("w.bf16");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, "BF16");
  EXPECT_EQ(0, memcmp(f.data(*t), b.data(), 10));
  out.assign(5, 0.f);
  f.read_f32(*t, out.data());
  for (size_t i = 0; i < 5; i++) EXPECT_EQ(out[i], bf16_to_f32(b[i]));

  t = f.find("w.f16");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{1, 3}));
  out.assign(3, 0.f);
  f.read_f32(*t, out.data());
  for (size_t i = 0; i < 3; i++) {
    EXPECT_EQ(out[i], f16_to_f32(c[i]));
    EXPECT_NEAR(out[i], csrc[i], 1e-2f);
  }

  t = f.find("ids");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, "I32");
  EXPECT_EQ(0, memcmp(f.data(*t), ids.data(), 12));
  expect_error([&] { f.read_f32(*t, out.data()); }, {path, "ids", "I32"});

  t = f.find("scalar");
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->shape.empty());
  EXPECT_EQ(t->numel(), 1);
  f.read_f32(*t, out.data());
  EXPECT_EQ(out[0], 42.5f);

  t = f.find("empty");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->numel(), 0);
  EXPECT_EQ(t->begin, t->end);

  // Laid out as the reference writer does: widest dtype first, every tensor aligned to its element size.
  for (const StTensor& s : f.tensors()) EXPECT_EQ(s.begin % st_dtype_size(s.dtype), 0u) << s.name;
  EXPECT_LT(f.find("ids")->begin, f.find("w.bf16")->begin);
  EXPECT_LT(f.find("w.bf16")->begin, f.find("w.f16")->begin);
}

TEST_F(SafetensorsTest, HeaderPaddedTo8) {
  uint16_t v[3] = {1, 2, 3};
  for (int len = 1; len <= 9; len++) {  // names of every length mod 8
    std::string path = at("pad" + std::to_string(len) + ".safetensors");
    write_safetensors(path, {{std::string((size_t)len, 'x'), "BF16", {3}, v}}, {});
    std::string s = slurp(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | (uint8_t)s[i];
    EXPECT_EQ(n % 8, 0u);
    ASSERT_EQ(s.size(), 8 + n + 6);
    std::string h = s.substr(8, n);
    size_t close = h.rfind('}');
    EXPECT_EQ(h.find_first_not_of(' ', close + 1), std::string::npos);  // padding is spaces
    EXPECT_LT(h.size() - close - 1, 8u);
    EXPECT_EQ(h.find("__metadata__"), std::string::npos);
    EXPECT_EQ(0, memcmp(s.data() + 8 + n, v, 6));
  }
}

TEST_F(SafetensorsTest, MetadataRoundTrip) {
  float x = 1.f;
  std::string path = at("m.safetensors");
  write_safetensors(path, {{"x", "F32", {1}, &x}});
  EXPECT_EQ(SafetensorsFile(path).metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));

  std::map<std::string, std::string> md = {{"format", "pt"}, {"quote\"and\\slash", "line\nbreak \xc3\xa9"}, {"e", ""}};
  write_safetensors(path, {{"x", "F32", {1}, &x}}, md);
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(), md);
  EXPECT_EQ(f.find("__metadata__"), nullptr);
  EXPECT_EQ(f.tensors().size(), 1u);
}

TEST_F(SafetensorsTest, WriterLeavesNoTmpFile) {
  float x[2] = {1.f, 2.f};
  write_safetensors(at("a.safetensors"), {{"x", "F32", {2}, x}});
  write_safetensors(at("a.safetensors"), {{"x", "F32", {2}, x}});  // overwrite
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
  EXPECT_EQ(files, (std::vector<std::string>{"a.safetensors"}));
}

TEST_F(SafetensorsTest, FailedWriteKeepsOldFile) {
  float good[2] = {1.f, 2.f}, bad[2] = {3.f, 4.f};
  std::string path = at("a.safetensors");
  write_safetensors(path, {{"x", "F32", {2}, good}});
  std::string before = slurp(path);

  // The temporary cannot be created (it is a directory; this fails even for root).
  fs::create_directory(path + ".tmp");
  expect_error([&] { write_safetensors(path, {{"x", "F32", {2}, bad}}); }, {path, ".tmp"});
  EXPECT_EQ(slurp(path), before);
  EXPECT_TRUE(fs::is_directory(path + ".tmp"));  // not ours to remove
  fs::remove(path + ".tmp");

  // Invalid input fails before anything is written.
  expect_error([&] { write_safetensors(path, {{"x", "F64", {2}, bad}}); }, {path, "x", "F64"});
  expect_error([&] { write_safetensors(path, {{"x", "F32", {-2}, bad}}); }, {path, "x", "negative"});
  expect_error([&] { write_safetensors(path, {{"x", "F32", {2}, bad}, {"x", "F32", {2}, bad}}); }, {path, "twice"});
  EXPECT_EQ(slurp(path), before);
  SafetensorsFile f(path);
  EXPECT_EQ(0, memcmp(f.data(*f.find("x")), good, 8));

  // A parent that is a regular file: an error naming the path, nothing left behind.
  std::string blocked = at("a.safetensors") + "/b.safetensors";
  expect_error([&] { write_safetensors(blocked, {{"x", "F32", {2}, bad}}); }, {blocked});
  EXPECT_EQ(slurp(path), before);
  expect_error([&] { write_safetensors_model(at("a.safetensors"), {{"x", "F32", {2}, bad}}, 100); },
               {at("a.safetensors")});
  EXPECT_EQ(slurp(path), before);
}

TEST_F(SafetensorsTest, ShardedWriteAndRead) {
  // 5 tensors of 16, 16, 40, 8, 8 bytes at a limit of 32 bytes: the 40-byte one exceeds the limit and is
  // its own shard, placed (as huggingface_hub does) ahead of the shard being filled when it came:
  // shards [big], [a, b], [d, e].
  std::vector<float> a = ramp(4, 1.f), b = ramp(4, 2.f), big = ramp(10, 3.f), d = ramp(2, 4.f);
  std::vector<uint16_t> e(4);
  for (size_t i = 0; i < 4; i++) e[i] = f32_to_bf16((float)i * 0.5f);
  std::vector<StEntry> entries = {{"a", "F32", {4}, a.data()},
                                  {"b", "F32", {2, 2}, b.data()},
                                  {"big", "F32", {10}, big.data()},
                                  {"d", "F32", {2}, d.data()},
                                  {"e", "BF16", {4}, e.data()}};
  std::string mdir = at("model");
  write_safetensors_model(mdir, entries, 32);

  std::vector<std::string> files;
  for (const auto& f : fs::directory_iterator(mdir)) files.push_back(f.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                             "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));

  std::string text = slurp(mdir + "/model.safetensors.index.json");
  json idx = json::parse(text);
  EXPECT_EQ(idx["metadata"]["total_size"], 88);
  json want = {{"a", "model-00002-of-00003.safetensors"},
               {"b", "model-00002-of-00003.safetensors"},
               {"big", "model-00001-of-00003.safetensors"},
               {"d", "model-00003-of-00003.safetensors"},
               {"e", "model-00003-of-00003.safetensors"}};
  EXPECT_EQ(idx["weight_map"], want);
  EXPECT_EQ(text.substr(0, 30), "{\n  \"metadata\": {\n    \"total_s");  // json.dumps(indent=2) style
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(SafetensorsFile(mdir + "/model-00002-of-00003.safetensors").metadata().at("format"), "pt");

  SafetensorsCheckpoint ck(mdir);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "big", "d", "e"}));
  for (const StEntry& en : entries) {
    const SafetensorsFile* f = nullptr;
    const StTensor* t = ck.find(en.name, &f);
    ASSERT_NE(t, nullptr) << en.name;
    EXPECT_EQ(f->path(), mdir + "/" + want[en.name].get<std::string>());
    EXPECT_EQ(t->dtype, en.dtype);
    EXPECT_EQ(t->shape, en.shape);
    EXPECT_EQ(0, memcmp(f->data(*t), en.data, t->end - t->begin)) << en.name;
  }
  EXPECT_EQ(ck.find("nope", nullptr), nullptr);

  // Saved again with room for everything: one model.safetensors, the old index and shards removed.
  write_safetensors_model(mdir, entries, 1000);
  files.clear();
  for (const auto& f : fs::directory_iterator(mdir)) files.push_back(f.path().filename().string());
  EXPECT_EQ(files, (std::vector<std::string>{"model.safetensors"}));
  SafetensorsCheckpoint one(mdir);
  EXPECT_EQ(one.names(), ck.names());
  const SafetensorsFile* f = nullptr;
  const StTensor* t = one.find("big", &f);
  ASSERT_NE(t, nullptr);
  std::vector<float> out(10);
  f->read_f32(*t, out.data());
  EXPECT_EQ(out, big);

  // And sharded once more: the single file goes, so the index is what gets loaded.
  write_safetensors_model(mdir, entries, 40);
  EXPECT_FALSE(fs::exists(mdir + "/model.safetensors"));
  EXPECT_EQ(SafetensorsCheckpoint(mdir).names(), ck.names());
}

TEST_F(SafetensorsTest, CheckpointSingleFile) {
  float x[3] = {1, 2, 3};
  write_safetensors(at("model.safetensors"), {{"x", "F32", {3}, x}, {"y", "F32", {1}, x}});
  SafetensorsCheckpoint by_dir(dir), by_file(at("model.safetensors"));
  EXPECT_EQ(by_dir.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(by_file.names(), by_dir.names());
  expect_error([&] { SafetensorsCheckpoint c(at("nothing")); }, {at("nothing"), "no such"});
  fs::create_directory(at("empty"));
  expect_error([&] { SafetensorsCheckpoint c(at("empty")); }, {at("empty"), "model.safetensors"});
}

// ---- bad files: each error names the file, the tensor where there is one, and what was wrong ----

TEST_F(SafetensorsTest, BadTruncatedFile) {
  std::string p = at("short.safetensors");
  spit(p, "abc");
  expect_error([&] { SafetensorsFile f(p); }, {p, "truncated", "3 bytes"});
  spit(p, "");
  expect_error([&] { SafetensorsFile f(p); }, {p, "truncated"});
  expect_error([&] { SafetensorsFile f(at("absent.safetensors")); }, {at("absent.safetensors"), "cannot open"});
}

TEST_F(SafetensorsTest, BadHeaderLength) {
  std::string p = at("h.safetensors");
  write_raw(p, "{}", "", 100);
  expect_error([&] { SafetensorsFile f(p); }, {p, "truncated", "header length 100"});
  write_raw(p, "{}", "", (int64_t)0x7fffffffffffffffLL);
  expect_error([&] { SafetensorsFile f(p); }, {p, "absurdly large"});
  std::string s(8, '\xff');  // 2^64 - 1
  spit(p, s + "{}");
  expect_error([&] { SafetensorsFile f(p); }, {p, "absurdly large"});
}

TEST_F(SafetensorsTest, BadHeaderJson) {
  expect_open_error(at("j.safetensors"), "{\"a\": {\"dtype\": ", "", {"not valid JSON", "parse error"});
  expect_open_error(at("j.safetensors"), "", "", {"not valid JSON"});
  expect_open_error(at("j.safetensors"), "[1, 2]", "", {"must be a JSON object", "array"});
  expect_open_error(at("j.safetensors"), "{\"__metadata__\": {\"k\": 1}}", "", {"__metadata__", "'k'", "string"});
  expect_open_error(at("j.safetensors"), "{\"__metadata__\": [1]}", "", {"__metadata__", "object"});
}

TEST_F(SafetensorsTest, BadEntryMissingField) {
  expect_open_error(at("e.safetensors"), R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", "abcd",
                    {"'w'", "missing", "dtype"});
  expect_open_error(at("e.safetensors"), R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", "abcd",
                    {"'w'", "missing", "shape"});
  expect_open_error(at("e.safetensors"), R"({"w": {"dtype": "F32", "shape": [1]}})", "abcd",
                    {"'w'", "missing", "data_offsets"});
  expect_open_error(at("e.safetensors"), R"({"w": 3})", "abcd", {"'w'", "must be a JSON object"});
}

TEST_F(SafetensorsTest, BadEntryTypes) {
  std::string p = at("e.safetensors");
  expect_open_error(p, R"({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", "abcd", {"'w'", "dtype", "string"});
  expect_open_error(p, R"({"w": {"dtype": "F32", "shape": "1", "data_offsets": [0, 4]}})", "abcd", {"'w'", "shape", "array"});
  expect_open_error(p, R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", "abcd", {"'w'", "shape", "integers"});
  expect_open_error(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", "abcd", {"'w'", "data_offsets", "[begin, end]"});
  expect_open_error(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, "4"]}})", "abcd", {"'w'", "data_offsets"});
  expect_open_error(p, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 4]}})", "abcd", {"'w'", "data_offsets"});
}

TEST_F(SafetensorsTest, BadUnknownDtype) {
  expect_open_error(at("d.safetensors"), R"({"w": {"dtype": "F17", "shape": [1], "data_offsets": [0, 4]}})", "abcd",
                    {"'w'", "unknown dtype", "F17"});
}

TEST_F(SafetensorsTest, BadNegativeDim) {
  expect_open_error(at("n.safetensors"), R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 0]}})", "",
                    {"'w'", "negative", "-1"});
}

TEST_F(SafetensorsTest, BadBeginAfterEnd) {
  expect_open_error(at("b.safetensors"), R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})",
                    "abcdefgh", {"'w'", "begin 8 > end 4"});
}

TEST_F(SafetensorsTest, BadEndOutOfRange) {
  expect_open_error(at("r.safetensors"), R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", "abcd",
                    {"'w'", "out of range", "4 bytes"});
  expect_open_error(at("r.safetensors"),
                    R"({"w": {"dtype": "U8", "shape": [4], "data_offsets": [18446744073709551612, 18446744073709551615]}})",
                    "abcd", {"'w'"});
}

TEST_F(SafetensorsTest, BadSizeMismatch) {
  expect_open_error(at("s.safetensors"), R"({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}})",
                    "abcdefgh", {"'w'", "size mismatch", "8 bytes", "needs 6"});
}

TEST_F(SafetensorsTest, BadOverlap) {
  expect_open_error(at("o.safetensors"),
                    R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                        "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                        "z": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}})",
                    "abcdefgh", {"'a'", "'b'", "overlap"});
  // Equal ranges, and a range swallowed by an earlier, longer one.
  expect_open_error(at("o.safetensors"),
                    R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                        "b": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})",
                    "abcd", {"'a'", "'b'", "overlap"});
  expect_open_error(at("o.safetensors"),
                    R"({"a": {"dtype": "U8", "shape": [12], "data_offsets": [0, 12]},
                        "b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}})",
                    "abcdefghijkl", {"'a'", "'b'", "overlap"});
  // Touching ranges and empty tensors are fine.
  write_raw(at("ok.safetensors"),
            R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                "c": {"dtype": "F32", "shape": [0], "data_offsets": [2, 2]}})",
            "abcdefgh");
  EXPECT_EQ(SafetensorsFile(at("ok.safetensors")).tensors().size(), 3u);
}

TEST_F(SafetensorsTest, BadNumelOverflow) {
  expect_open_error(at("v.safetensors"),
                    R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", "",
                    {"'w'", "overflow"});
  expect_open_error(at("v.safetensors"),
                    R"({"w": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", "",
                    {"'w'", "overflow"});
  expect_open_error(at("v.safetensors"), R"({"w": {"dtype": "F32", "shape": [1e30], "data_offsets": [0, 0]}})", "",
                    {"'w'", "shape"});
}

TEST_F(SafetensorsTest, BadDuplicateName) {
  expect_open_error(at("u.safetensors"),
                    R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                        "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                    "ab", {"'w'", "twice"});
}

// ---- bad sharded checkpoints ----

class SafetensorsShardTest : public SafetensorsTest {
 protected:
  float x[2] = {1.f, 2.f};
  std::string index;
  void SetUp() override {
    SafetensorsTest::SetUp();
    index = at("model.safetensors.index.json");
    write_safetensors(at("s1.safetensors"), {{"a", "F32", {2}, x}, {"b", "F32", {1}, x}});
    write_safetensors(at("s2.safetensors"), {{"c", "F32", {2}, x}});
  }
};

TEST_F(SafetensorsShardTest, Good) {
  spit(index, R"({"metadata": {"total_size": 20}, "weight_map": {"a": "s1.safetensors", "b": "s1.safetensors",
                                                               "c": "s2.safetensors"}})");
  SafetensorsCheckpoint ck(dir);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));
  const SafetensorsFile* f = nullptr;
  ASSERT_NE(ck.find("c", &f), nullptr);
  EXPECT_EQ(f->path(), at("s2.safetensors"));
}

TEST_F(SafetensorsShardTest, BadIndexJson) {
  spit(index, "{\"weight_map\": {\"a\": ");
  expect_error([&] { SafetensorsCheckpoint c(dir); }, {index, "not valid JSON"});
  spit(index, R"({"metadata": {}})");
  expect_error([&] { SafetensorsCheckpoint c(dir); }, {index, "malformed", "weight_map"});
  spit(index, R"({"weight_map": ["a"]})");
  expect_error([&] { SafetensorsCheckpoint c(dir); }, {index, "malformed", "weight_map"});
  spit(index, R"({"weight_map": {"a": 1}})");
  expect_error([&] { SafetensorsCheckpoint c(dir); }, {index, "malformed", "'a'"});
  spit(index, R"({"weight_map": {"a": "../s1.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(dir); }, {index, "malformed", "'a'", "../s1.safetensors"});
  spit(index, R"({"weight_map": {}})");
  expect_error([&] { SafetensorsCheckpoint c(dir); }, {index, "empty"});
}

TEST_F(SafetensorsShardTest, BadMissingShardFile) {
  spit(index, R"({"weight_map": {"a": "s1.safetensors", "c": "s3.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(dir); }, {index, "'c'", "s3.safetensors", "does not exist"});
}

TEST_F(SafetensorsShardTest, BadNameNotInShard) {
  spit(index, R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s1.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(dir); }, {index, "'c'", "s1.safetensors", "does not contain"});
  // c is in s2, but the map sends it to s1 while naming s2 for another tensor
  spit(index, R"({"weight_map": {"a": "s2.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(dir); }, {index, "'a'", "s2.safetensors", "does not contain"});
}

TEST_F(SafetensorsShardTest, BadNameInTwoShards) {
  write_safetensors(at("s2.safetensors"), {{"c", "F32", {2}, x}, {"a", "F32", {2}, x}});
  spit(index, R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(dir); }, {"'a'", "two shards", "s1.safetensors", "s2.safetensors"});
}

TEST_F(SafetensorsShardTest, BadShardFile) {
  spit(at("s2.safetensors"), "junk");
  spit(index, R"({"weight_map": {"a": "s1.safetensors", "c": "s2.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(dir); }, {at("s2.safetensors"), "truncated"});
}
