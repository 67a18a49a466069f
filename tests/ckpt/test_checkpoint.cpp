// Checkpoint directories in one process: CRC-32C, the manifest, verification, find_latest,
// save_total_limit, failures that must leave earlier checkpoints intact. (The HDF5 training state
// needs MPI: tests/mpi/ckpt_resume.cpp covers it, its errors included, at 1 to 4 ranks.)
#include "engine/ckpt/checkpoint.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/core/error.h"

using namespace llmt;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A world of one, without MPI.
class SoloComm : public ControlComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void barrier() override {}
  double all_reduce_sum(double x) override { return x; }
  void all_gather(const void* send, void* recv, int64_t count, DType t) override {
    std::memmove(recv, send, (size_t)count * dtype_size(t));
  }
  void broadcast(void*, int64_t, DType, int) override {}
  std::unique_ptr<ControlComm> split(int, int) override { return std::make_unique<SoloComm>(); }
  void* native_handle() override { return nullptr; }
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Writes a file, throwing on any error (as a real writer must).
void spit(const std::string& path, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  LLMT_CHECK(fd >= 0, "%s: %s", path.c_str(), strerror(errno));
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (w <= 0) {
      int e = errno;
      ::close(fd);
      fail("%s: write failed: %s", path.c_str(), strerror(e));
    }
    off += (size_t)w;
  }
  LLMT_CHECK(::close(fd) == 0, "%s: close failed", path.c_str());
}

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = (char)(g() & 0xff);
  return s;
}

// bit-by-bit CRC-32C: the definition
uint32_t crc32c_ref(const std::string& s) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

class CheckpointTest : public ::testing::Test {
 protected:
  std::string dir;
  SoloComm world;
  void SetUp() override {
    char tmpl[] = "/tmp/llmt_ckpt_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
  }
  void TearDown() override { fs::remove_all(dir); }

  // A checkpoint with a weights file, a subdirectory and a small JSON.
  std::string save(int64_t step, size_t bytes = 3 << 20) {
    return save_checkpoint_dir(dir, step, world, [&](const std::string& d) {
      spit(d + "/state.bin", random_bytes(bytes, (uint32_t)step));
      ::mkdir((d + "/tok").c_str(), 0755);
      spit(d + "/tok/tokenizer.json", "{\"step\": " + std::to_string(step) + "}");
    });
  }
};

TEST(Crc32c, KnownValuesAndCombine) {
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xE3069283u);  // the standard check value
  EXPECT_EQ(crc32c(0, "", 0), 0u);
  std::string s = random_bytes(100003, 1);
  uint32_t whole = crc32c(0, s.data(), s.size());
  EXPECT_EQ(whole, crc32c_ref(s));
  for (size_t cut : {(size_t)0, (size_t)1, (size_t)7, (size_t)4096, (size_t)99999, s.size()}) {
    uint32_t a = crc32c(0, s.data(), cut), b = crc32c(0, s.data() + cut, s.size() - cut);
    EXPECT_EQ(crc32c(a, s.data() + cut, s.size() - cut), whole) << "running value, cut " << cut;
    EXPECT_EQ(crc32c_combine(a, b, s.size() - cut), whole) << "combined, cut " << cut;
  }
  // odd alignments and lengths
  for (size_t off = 0; off < 9; off++)
    for (size_t n : {(size_t)0, (size_t)1, (size_t)5, (size_t)8, (size_t)15, (size_t)64, (size_t)1001})
      EXPECT_EQ(crc32c(0, s.data() + off, n), crc32c_ref(s.substr(off, n))) << off << " " << n;
}

TEST(Crc32c, FilesInParallelChunks) {
  char tmpl[] = "/tmp/llmt_crc_XXXXXX";
  int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::string s = random_bytes((70 << 20) + 12345, 3);  // three 32 MiB chunks, the last one short
  spit(tmpl, s);
  EXPECT_EQ(crc32c_file(tmpl), crc32c(0, s.data(), s.size()));
  EXPECT_EQ(crc32c_file(tmpl, 777, (int64_t)s.size() - 999), crc32c(0, s.data() + 777, s.size() - 777 - 999));
  EXPECT_EQ(crc32c_file(tmpl, 5, 5), 0u);
  EXPECT_THROW(crc32c_file(tmpl, 0, (int64_t)s.size() + 10), Error);  // past the end
  ::unlink(tmpl);
  EXPECT_THROW(crc32c_file(tmpl), Error);
  for (size_t off = 1; off < 8; off++)  // the interleaved path from unaligned starts
    EXPECT_EQ(crc32c(0, s.data() + off, 50001), crc32c_ref(s.substr(off, 50001))) << off;
}

TEST(Crc32c, Speed) {  // reported, not asserted
  std::string s = random_bytes(64 << 20, 2);
  auto t0 = std::chrono::steady_clock::now();
  uint32_t c = 0;
  for (int i = 0; i < 4; i++) c = crc32c(c, s.data(), s.size());
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("crc32c: %.2f GB/s (value %08x)\n", 4.0 * s.size() / sec / 1e9, c);
}

TEST_F(CheckpointTest, ManifestRoundTrip) {
  std::string ck = save(10);
  EXPECT_EQ(ck, dir + "/checkpoint-10");
  ASSERT_TRUE(fs::is_directory(ck));
  for (auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  json m = json::parse(slurp(ck + "/manifest.json"));
  EXPECT_EQ(m["format"], "llmt-checkpoint");
  EXPECT_EQ(m["step"], 10);
  EXPECT_EQ(m["checksum"], "crc32c");
  ASSERT_EQ(m["files"].size(), 2u);
  for (const char* f : {"state.bin", "tok/tokenizer.json"}) {
    ASSERT_TRUE(m["files"].contains(f)) << f;
    EXPECT_EQ(m["files"][f]["size"].get<int64_t>(), (int64_t)fs::file_size(ck + "/" + f));
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%08x", crc32c_ref(slurp(ck + "/" + f)));
    EXPECT_EQ(m["files"][f]["crc32c"].get<std::string>(), hex) << f;
  }
  EXPECT_NO_THROW(verify_checkpoint(ck));
  EXPECT_EQ(find_latest_checkpoint(dir, true), ck);
}

TEST_F(CheckpointTest, VerifyCatchesFlippedByteAndTruncation) {
  std::string ck = save(5);
  std::string path = ck + "/state.bin";
  std::string bytes = slurp(path);
  std::string bad = bytes;
  bad[bytes.size() / 2] ^= 0x10;
  spit(path, bad);
  EXPECT_TRUE(checkpoint_problem(ck, false).empty()) << "the cheap check sees sizes only";
  try {
    verify_checkpoint(ck);
    ADD_FAILURE() << "a flipped byte passed verification";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("state.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CRC-32C"), std::string::npos) << e.what();
  }
  EXPECT_EQ(find_latest_checkpoint(dir, true), "");
  spit(path, bytes.substr(0, bytes.size() - 100));
  try {
    verify_checkpoint(ck);
    ADD_FAILURE() << "a truncated file passed verification";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  EXPECT_EQ(find_latest_checkpoint(dir, false), "") << "wrong size: incomplete even without checksums";
  fs::remove(path);
  EXPECT_NE(checkpoint_problem(ck, false).find("state.bin"), std::string::npos);
}

TEST_F(CheckpointTest, FindLatestSkipsTemporaryAndIncomplete) {
  EXPECT_EQ(find_latest_checkpoint(dir), "");
  EXPECT_EQ(find_latest_checkpoint(dir + "/nonexistent"), "");
  std::string c2 = save(2);
  save(3);
  // a newer temporary directory, a newer directory without a manifest, one with a missing file,
  // one with a manifest that is not JSON, and names that only look like checkpoints
  fs::create_directories(dir + "/checkpoint-9.tmp-abc");
  spit(dir + "/checkpoint-9.tmp-abc/manifest.json", slurp(c2 + "/manifest.json"));
  fs::create_directories(dir + "/checkpoint-8");
  fs::copy(dir + "/checkpoint-3", dir + "/checkpoint-7", fs::copy_options::recursive);
  fs::remove(dir + "/checkpoint-7/tok/tokenizer.json");
  fs::copy(dir + "/checkpoint-3", dir + "/checkpoint-6", fs::copy_options::recursive);
  spit(dir + "/checkpoint-6/manifest.json", "{not json");
  fs::create_directories(dir + "/checkpoint-10x");
  spit(dir + "/checkpoint-11", "a file");
  EXPECT_EQ(find_latest_checkpoint(dir), dir + "/checkpoint-3");
  // corrupt the newest: only a verifying search skips it
  std::string s = slurp(dir + "/checkpoint-3/state.bin");
  s[0] ^= 1;
  spit(dir + "/checkpoint-3/state.bin", s);
  EXPECT_EQ(find_latest_checkpoint(dir, false), dir + "/checkpoint-3");
  EXPECT_EQ(find_latest_checkpoint(dir, true), c2);
  std::vector<CheckpointEntry> all = list_checkpoint_dirs(dir);
  ASSERT_EQ(all.size(), 5u);  // 2 3 6 7 8
  EXPECT_EQ(all.front().step, 2);
  EXPECT_EQ(all.back().step, 8);
}

TEST_F(CheckpointTest, SaveTotalLimit) {
  for (int s = 1; s <= 5; s++) save(s * 10, 1000);
  EXPECT_TRUE(apply_save_total_limit(dir, 0).empty()) << "0: keep everything";
  std::vector<std::string> gone = apply_save_total_limit(dir, 2, dir + "/checkpoint-10");
  EXPECT_EQ(gone.size(), 2u);
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-10")) << "the protected one stays";
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-20"));
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-30"));
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-40"));
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-50"));
  for (auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  // an incomplete newer directory does not push out the newest complete checkpoint
  fs::create_directories(dir + "/checkpoint-60");
  apply_save_total_limit(dir, 1);
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-60"));
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-50"));
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-40"));
  EXPECT_EQ(find_latest_checkpoint(dir), dir + "/checkpoint-50");
}

TEST_F(CheckpointTest, StaleTemporaryDirectoriesGoAtTheNextSave) {
  fs::create_directories(dir + "/checkpoint-4.tmp-dead/sub");
  spit(dir + "/checkpoint-4.tmp-dead/sub/x", "partial");
  fs::create_directories(dir + "/checkpoint-2.tmp-del-1234");
  fs::create_directories(dir + "/unrelated.tmp-1");
  save(5, 100);
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-4.tmp-dead"));
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-2.tmp-del-1234"));
  EXPECT_TRUE(fs::exists(dir + "/unrelated.tmp-1")) << "not ours";
}

TEST_F(CheckpointTest, ResavingAStepReplacesIt) {
  save(7, 100);
  std::string ck = save(7, 200);
  EXPECT_EQ(fs::file_size(ck + "/state.bin"), 200u);
  EXPECT_NO_THROW(verify_checkpoint(ck));
  for (auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// Issue 23: a manifest edited to "files": {} passed verification, so a replaced state file then
// loaded in export and resume. The manifest must list every file the directory holds, and the
// files the caller's checkpoints always have.
TEST_F(CheckpointTest, ManifestMustListEveryFileAndTheRequiredOnes) {
  std::string ck = save(4, 1000);
  const std::string manifest = slurp(ck + "/manifest.json");
  EXPECT_EQ(checkpoint_problem(ck, true, {"state.bin", "tok/tokenizer.json"}), "");
  json m = json::parse(manifest);
  m["files"] = json::object();
  spit(ck + "/manifest.json", m.dump());
  spit(ck + "/state.bin", random_bytes(1000, 99));  // replaced weights
  std::string why = checkpoint_problem(ck, true);
  EXPECT_NE(why.find("state.bin, tok/tokenizer.json not listed in the manifest"), std::string::npos) << why;
  EXPECT_THROW(verify_checkpoint(ck), Error);
  EXPECT_EQ(find_latest_checkpoint(dir, true), "");
  EXPECT_EQ(find_latest_checkpoint(dir, false), "") << "an unlisted file fails the cheap check too";

  // a file added beside a complete manifest, in a subdirectory, or as a link
  spit(ck + "/manifest.json", manifest);
  save(4, 1000);  // a fresh, complete one
  EXPECT_EQ(checkpoint_problem(ck, true), "");
  spit(ck + "/tok/extra.json", "{}");
  why = checkpoint_problem(ck, false);
  EXPECT_NE(why.find("tok/extra.json not listed"), std::string::npos) << why;
  fs::remove(ck + "/tok/extra.json");
  fs::create_symlink("/etc/hostname", ck + "/link");
  EXPECT_NE(checkpoint_problem(ck, false).find("link not listed"), std::string::npos);
  fs::remove(ck + "/link");
  EXPECT_EQ(checkpoint_problem(ck, true), "");

  // the required files: a manifest that drops one, with the file gone too
  m = json::parse(manifest);
  m["files"].erase("state.bin");
  spit(ck + "/manifest.json", m.dump());
  fs::remove(ck + "/state.bin");
  EXPECT_EQ(checkpoint_problem(ck, true), "") << "without requirements, a smaller checkpoint is complete";
  why = checkpoint_problem(ck, true, {"state.bin"});
  EXPECT_NE(why.find("does not list state.bin"), std::string::npos) << why;
  EXPECT_EQ(find_latest_checkpoint(dir, true, {"state.bin"}), "");

  // an entry outside the directory
  m = json::parse(manifest);
  m["files"]["../outside"] = {{"size", 0}, {"crc32c", "00000000"}};
  spit(ck + "/manifest.json", m.dump());
  EXPECT_NE(checkpoint_problem(ck, false).find("not a path inside the checkpoint"), std::string::npos);
}

TEST_F(CheckpointTest, FailedWriteLeavesEarlierCheckpointsIntact) {
  std::string good = save(1, 1000);
  try {
    save_checkpoint_dir(dir, 2, world, [&](const std::string& d) {
      spit(d + "/state.bin", "half");
      fail("%s/model.safetensors: write failed: No space left on device", d.c_str());
    });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("checkpoint-2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("No space left"), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-2"));
  for (auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  EXPECT_NO_THROW(verify_checkpoint(good));
  EXPECT_EQ(find_latest_checkpoint(dir, true), good);
}

TEST_F(CheckpointTest, UnwritableOutputDirectory) {
  spit(dir + "/afile", "x");
  try {
    save_checkpoint_dir(dir + "/afile/out", 1, world, [](const std::string&) {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/afile"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Not a directory"), std::string::npos) << e.what();
  }
}

// A file-size limit (RLIMIT_FSIZE) in a child process: the save fails with EFBIG (not SIGXFSZ),
// the temporary directory goes, the earlier checkpoint stays complete.
TEST_F(CheckpointTest, FileSizeLimit) {
  std::string good = save(1, 1000);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl;
    getrlimit(RLIMIT_FSIZE, &rl);
    rl.rlim_cur = 64 << 10;
    setrlimit(RLIMIT_FSIZE, &rl);
    int code = 1;
    try {
      save(2, 1 << 20);
      code = 2;  // no error
    } catch (const Error& e) {
      code = std::string(e.what()).find("File too large") != std::string::npos ? 0 : 3;
      if (code) std::fprintf(stderr, "%s\n", e.what());
    }
    std::_Exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-2"));
  for (auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  EXPECT_EQ(find_latest_checkpoint(dir, true), good);
}

// A full file system (a tiny tmpfs; skipped where mounting is not allowed): the manifest write
// itself hits ENOSPC after the caller's files filled the disk.
TEST_F(CheckpointTest, FullDisk) {
  std::string mnt = dir + "/mnt";
  fs::create_directories(mnt);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) GTEST_SKIP() << "cannot mount a tmpfs here";
  std::string out = mnt + "/out";
  std::string msg;
  std::string good;
  try {
    good = save_checkpoint_dir(out, 1, world, [](const std::string& d) { spit(d + "/a", "small"); });
    save_checkpoint_dir(out, 2, world, [](const std::string& d) {
      // fill every last block, ignoring the short write, so that only the manifest fails
      int fd = ::open((d + "/fill").c_str(), O_WRONLY | O_CREAT, 0644);
      std::string chunk(4096, 'x');
      while (::write(fd, chunk.data(), chunk.size()) > 0) {
      }
      ::close(fd);
    });
  } catch (const Error& e) {
    msg = e.what();
  }
  bool gone = !fs::exists(out + "/checkpoint-2");
  bool intact = checkpoint_problem(good, true).empty();
  size_t tmps = 0;
  for (auto& e : fs::directory_iterator(out)) tmps += e.path().filename().string().find(".tmp-") != std::string::npos;
  umount(mnt.c_str());
  EXPECT_NE(msg.find("No space left"), std::string::npos) << msg;
  EXPECT_NE(msg.find("manifest.json"), std::string::npos) << msg;
  EXPECT_TRUE(gone);
  EXPECT_TRUE(intact);
  EXPECT_EQ(tmps, 0u);
}

}  // namespace
