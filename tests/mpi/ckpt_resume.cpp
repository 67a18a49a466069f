// Resuming from the parallel-HDF5 training state under mpirun (ctest runs this at 1, 2, 3 and 4
// ranks): a run saved at one world size and strategy, loaded at another, holds bitwise the same
// master weights and Adam moments, and trains on to the same losses as the run never stopped
// (bitwise at the same split; within tests/tolerances.h's fp32 loss bound at another, where sums
// group differently).
// Also: every error a damaged or foreign state.h5 can cause is one clear llmt::Error on every rank
// at once (none hangs), and checkpoint directories commit with checksums computed over all ranks.
// With LLMT_TEST_DEVICE=cuda the runs use the CUDA backend (the SIMT emulator in ctest): the state
// is staged between device and file.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/train_state.h"
#include "engine/core/error.h"
#include "engine/dist/launch.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/fsdp/fsdp.h"
#include "engine/fsdp/staged_comm.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/transformer.h"
#include "tests/mpi/test_comm.h"
#include "tests/mpi/tiny_models.h"
#include "tests/tolerances.h"
#include "train/step.h"

using namespace llmt;
namespace fs = std::filesystem;

namespace {

ControlComm* g_world = nullptr;
int g_local_size = 1;
std::string g_device = "cpu";
std::string g_dir;  // a fresh directory, the same on every rank
const int kGlobal = 12, kT = 11, kSaveAt = 3, kSteps = 6;

std::string config_json(const ModelConfig& c) { return config_to_hf_json(c).dump(); }

// One training run: a model, its store over `comm`, this rank's slice of each global batch.
struct TrainRun {
  ModelConfig cfg;
  ControlComm& comm;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<FsdpStore> store;
  int B;
  std::unique_ptr<DataComm> data;
  std::unique_ptr<StepScalars> scalars;
  TrainRun(const ModelConfig& c, ControlComm& cm, Strategy s, int local_size, DType compute = DType::f32)
      : cfg(c), comm(cm) {
    be = g_device == "cpu" ? make_cpu_backend(1, compute) : make_cuda_backend(0, compute, false);
    data = make_test_data_comm(comm, *be);
    B = kGlobal / comm.size();
    model = std::make_unique<Transformer>(cfg, *be, B, kT, false);
    store = std::make_unique<FsdpStore>(*be, model->layout(), s, *data, local_size);
    scalars = std::make_unique<StepScalars>(*be);
  }
  const ModelLayout& layout() const { return model->layout(); }
  void init() {
    std::vector<float> host;
    for (size_t u = 0; u < layout().units.size(); u++) {
      host.resize((size_t)layout().units[u].numel);
      init_unit_params(cfg, layout().units[u], (int)u, 7, host.data());
      store->set_unit((int)u, host.data());
    }
  }
  double step(int step) {
    std::vector<int32_t> tokens, targets;
    tiny_global_batch(step, kGlobal, kT, tokens, targets);  // different every step
    int64_t first = (int64_t)comm.rank() * B;
    StepSettings ss;
    ss.lr = 3e-3f;
    ss.adamw.weight_decay = 0.1f;
    ss.max_grad_norm = 0.5;
    ss.seed = 5;
    ss.step = step;
    return train_step(*model, *store, comm, *data, *scalars, {{tokens.data() + first * kT, targets.data() + first * kT, kT, first}},
                      ss)
        .loss;
  }
  void save(const std::string& path, int64_t global_step) {
    save_train_state(path, comm, layout(), *store, global_step, "{\"rng\": [1, 2, 3]}", config_json(cfg));
  }
  LoadedTrainState load(const std::string& path) {
    return load_train_state(path, comm, layout(), *store, config_json(cfg));
  }
  // Full master, m and v of every unit, gathered from every rank's shard over `comm`.
  std::vector<std::vector<float>> gather(int kind) {
    std::vector<std::vector<float>> out;
    const int W = comm.size();
    for (size_t u = 0; u < layout().units.size(); u++) {
      FsdpStore::ShardState s = store->shard_state((int)u);
      int64_t n = store->shard_numel((int)u);
      std::vector<float> mine((size_t)n);
      be->copy_to_host(mine.data(), (kind == 0 ? s.master : kind == 1 ? s.m : s.v).data, (size_t)n * 4);
      std::vector<float> all((size_t)(n * W));
      comm.all_gather(mine.data(), all.data(), n, DType::f32);
      int32_t lohi[2] = {(int32_t)s.lo, (int32_t)s.hi};
      std::vector<int32_t> ranges(2 * (size_t)W);
      comm.all_gather(lohi, ranges.data(), 2, DType::i32);
      std::vector<float> full((size_t)layout().units[u].numel, NAN);
      for (int r = 0; r < W; r++)
        for (int64_t i = ranges[2 * r]; i < ranges[2 * r + 1]; i++)
          full[(size_t)i] = all[(size_t)(r * n + i - ranges[2 * r])];
      out.push_back(std::move(full));
    }
    return out;
  }
};

using State = std::vector<std::vector<std::vector<float>>>;  // [kind][unit][i]
State gather_state(TrainRun& r) { return {r.gather(0), r.gather(1), r.gather(2)}; }

void expect_bitwise(const State& got, const State& want, const std::string& what) {
  const char* kinds[3] = {"master", "adam_m", "adam_v"};
  for (int k = 0; k < 3; k++)
    for (size_t u = 0; u < want[k].size(); u++) {
      ASSERT_EQ(got[k][u].size(), want[k][u].size());
      size_t bad = 0;
      for (size_t i = 0; i < want[k][u].size(); i++) bad += std::memcmp(&got[k][u][i], &want[k][u][i], 4) != 0;
      EXPECT_EQ(bad, 0u) << what << ": " << kinds[k] << " unit " << u << " differs in " << bad << " elements";
    }
}

std::string shared_path(const std::string& name) { return g_dir + "/" + name; }

// Rank 0 changes a file; every rank waits for it.
template <class F>
void on_rank0(F&& f) {
  if (g_world->rank() == 0) f();
  g_world->barrier();
}

// With dropout on (GPT-2 everywhere, LLaMA on attention): a resumed run draws the same masks.
void check_resume(Arch arch, Strategy save_strategy, int save_local, DType compute = DType::f32) {
  const int W = g_world->size(), r = g_world->rank();
  ModelConfig cfg = tiny_model(arch);
  cfg.attn_pdrop = 0.1f;
  if (arch == Arch::gpt2) cfg.embd_pdrop = cfg.resid_pdrop = 0.1f;
  const double loss_tol = compute == DType::f32 ? llmt_test::tol::kF32Loss : llmt_test::tol::kBf16ReorderLoss;
  std::string tag = std::string(arch == Arch::gpt2 ? "gpt2" : "llama") + " saved " + strategy_name(save_strategy) +
                    " W=" + std::to_string(W) + " " + dtype_name(compute);
  std::string path = shared_path(std::string("state_") + cfg.arch_name() + "_" + strategy_name(save_strategy) + "_" +
                                 dtype_name(compute) + ".h5");

  // the uninterrupted run, saved midway
  TrainRun a(cfg, *g_world, save_strategy, save_local, compute);
  a.init();
  std::vector<double> ref;
  State saved;
  for (int s = 0; s < kSteps; s++) {
    if (s == kSaveAt) {
      a.save(path, s);
      saved = gather_state(a);
    }
    ref.push_back(a.step(s));
  }

  // the same world and strategy: bitwise state, bitwise losses
  {
    TrainRun b(cfg, *g_world, save_strategy, save_local, compute);
    LoadedTrainState st = b.load(path);
    EXPECT_EQ(st.global_step, kSaveAt);
    EXPECT_EQ(st.adam_step, kSaveAt);
    EXPECT_EQ(b.store->steps_done(), kSaveAt);
    EXPECT_EQ(st.scalars_json, "{\"rng\": [1, 2, 3]}");
    expect_bitwise(gather_state(b), saved, tag + ", loaded the same way");
    for (int s = kSaveAt; s < kSteps; s++) EXPECT_EQ(b.step(s), ref[s]) << tag << ", same split, step " << s;
  }
  // full_shard over every rank (a different strategy when the save was not full_shard)
  {
    TrainRun b(cfg, *g_world, Strategy::full_shard, g_local_size, compute);
    b.load(path);
    expect_bitwise(gather_state(b), saved, tag + ", loaded full_shard");
    for (int s = kSaveAt; s < kSteps; s++)
      EXPECT_NEAR(b.step(s), ref[s], loss_tol * std::fabs(ref[s])) << tag << ", loaded full_shard, step " << s;
  }
  // every rank alone (no_shard on a communicator of one), the whole batch in one micro-batch
  {
    std::unique_ptr<ControlComm> self = g_world->split(r, 0);
    TrainRun b(cfg, *self, Strategy::no_shard, 1, compute);
    b.load(path);
    expect_bitwise(gather_state(b), saved, tag + ", loaded alone");
    for (int s = kSaveAt; s < kSteps; s++)
      EXPECT_NEAR(b.step(s), ref[s], loss_tol * std::fabs(ref[s])) << tag << ", loaded alone, step " << s;
  }
  // full_shard over two of three ranks (and the third alone), while both groups read at once
  if (W >= 3) {
    std::unique_ptr<ControlComm> sub = g_world->split(r < 2 ? 0 : 1, r);
    TrainRun b(cfg, *sub, r < 2 ? Strategy::full_shard : Strategy::no_shard, 1, compute);
    if (kGlobal % sub->size() == 0) {
      b.load(path);
      expect_bitwise(gather_state(b), saved, tag + ", loaded on a sub-communicator");
      for (int s = kSaveAt; s < kSteps; s++)
        EXPECT_NEAR(b.step(s), ref[s], loss_tol * std::fabs(ref[s])) << tag << ", sub-communicator, step " << s;
    }
  }
}

// Expects every rank to throw an llmt::Error whose message holds each of `needles`.
template <class F>
void expect_error_everywhere(F&& f, const std::vector<std::string>& needles, const std::string& what) {
  std::string msg;
  try {
    f();
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_FALSE(msg.empty()) << what << ": no error on rank " << g_world->rank();
  if (g_world->rank() == 0) std::printf("  %s -> %s\n", what.c_str(), msg.c_str());
  for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << what << ": " << msg;
  // every rank is still in step
  EXPECT_EQ(g_world->all_reduce_sum(1.0), (double)g_world->size()) << what;
}

void copy_file(const std::string& from, const std::string& to, int64_t keep_bytes = -1) {
  std::ifstream in(from, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (keep_bytes >= 0) s.resize((size_t)keep_bytes);
  std::ofstream(to, std::ios::binary).write(s.data(), (std::streamsize)s.size());
}

}  // namespace

TEST(CkptResume, Gpt2FullShard) { check_resume(Arch::gpt2, Strategy::full_shard, g_local_size); }
TEST(CkptResume, Gpt2FullShardBf16) { check_resume(Arch::gpt2, Strategy::full_shard, g_local_size, DType::bf16); }
TEST(CkptResume, LlamaShardGradOp) { check_resume(Arch::llama, Strategy::shard_grad_op, g_local_size); }
TEST(CkptResume, Gpt2NoShard) { check_resume(Arch::gpt2, Strategy::no_shard, g_local_size); }
TEST(CkptResume, LlamaHybridShard) {
  // pairs of ranks share shards where the world has pairs: replicas other than 0 write nothing
  int W = g_world->size();
  check_resume(Arch::llama, Strategy::hybrid_shard, W % 2 == 0 ? 2 : g_local_size);
}

TEST(CkptErrors, DamagedOrForeignState) {
  ModelConfig cfg = tiny_model(Arch::gpt2);
  TrainRun a(cfg, *g_world, Strategy::full_shard, g_local_size);
  a.init();
  a.step(0);
  std::string good = shared_path("good.h5");
  a.save(good, 1);
  int64_t size = (int64_t)fs::file_size(good);

  expect_error_everywhere([&] { a.load(shared_path("missing.h5")); }, {"missing.h5", "No such file"}, "missing");
  on_rank0([&] { copy_file(good, shared_path("trunc.h5"), size / 2); });
  expect_error_everywhere([&] { a.load(shared_path("trunc.h5")); }, {"trunc.h5", "truncated"}, "truncated");
  on_rank0([&] { copy_file(good, shared_path("empty.h5"), 0); });
  expect_error_everywhere([&] { a.load(shared_path("empty.h5")); }, {"empty.h5"}, "empty");
  on_rank0([&] { std::ofstream(shared_path("junk.h5"), std::ios::binary) << std::string(4096, 'j'); });
  expect_error_everywhere([&] { a.load(shared_path("junk.h5")); }, {"junk.h5", "cannot open as HDF5"}, "not HDF5");
  // a damaged superblock (HDF5 checksums its metadata)
  on_rank0([&] {
    copy_file(good, shared_path("corrupt.h5"));
    std::fstream f(shared_path("corrupt.h5"), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(20);
    f.write("\x5a\x5a\x5a\x5a", 4);
  });
  expect_error_everywhere([&] { a.load(shared_path("corrupt.h5")); }, {"corrupt.h5"}, "corrupt superblock");

  // another configuration: the config keys that differ, and the first tensor that differs
  {
    ModelConfig other = tiny_model(Arch::gpt2, 30);
    TrainRun b(other, *g_world, Strategy::full_shard, g_local_size);
    expect_error_everywhere([&] { b.load(good); },
                            {"good.h5", "another model configuration", "n_embd 25 in the file, 30 here",
                             "transformer.wte.weight [259,25] in the file, transformer.wte.weight [259,30] here"},
                            "another d_model");
    ModelConfig llama = tiny_model(Arch::llama);
    TrainRun c(llama, *g_world, Strategy::full_shard, g_local_size);
    expect_error_everywhere([&] { load_train_state(good, *g_world, c.layout(), *c.store, ""); },
                            {"another model configuration", "tensor 0 is"}, "another family, no config given");
  }
  // nowhere to write: a directory that does not exist
  expect_error_everywhere([&] { a.save(shared_path("no/such/dir/state.h5"), 1); }, {"no/such/dir/state.h5"},
                          "unwritable");
  // a file-size limit on every rank: space is reserved up front, so it fails before any data moves
  {
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 64 << 10;
    setrlimit(RLIMIT_FSIZE, &lim);
    expect_error_everywhere([&] { a.save(shared_path("limited.h5"), 1); }, {"limited.h5", "File too large"},
                            "file-size limit");
    setrlimit(RLIMIT_FSIZE, &old);
  }
  // a full disk: a tiny tmpfs, where this process may mount one
  {
    std::string mnt = shared_path("mnt");
    int mounted = 0;
    on_rank0([&] {
      fs::create_directories(mnt);
      mounted = mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=96k") == 0;
    });
    g_world->broadcast(&mounted, 1, DType::i32, 0);
    if (mounted) {
      expect_error_everywhere([&] { a.save(mnt + "/state.h5", 1); }, {"state.h5", "No space left"}, "full disk");
      on_rank0([&] { umount(mnt.c_str()); });
    }
  }
  // after all that, the good file still loads and the run is unchanged
  TrainRun d(cfg, *g_world, Strategy::full_shard, g_local_size);
  d.load(good);
  expect_bitwise(gather_state(d), gather_state(a), "after the errors");
}

TEST(CkptDirs, SaveCommitVerifyAcrossRanks) {
  ModelConfig cfg = tiny_model(Arch::llama);
  TrainRun a(cfg, *g_world, Strategy::full_shard, g_local_size);
  a.init();
  a.step(0);
  std::string out = shared_path("out");
  auto write = [&](const std::string& dir) {
    a.save(dir + "/state.h5", 1);
    if (g_world->rank() == 0) std::ofstream(dir + "/trainer_state.json") << "{\"global_step\": 1}\n";
  };
  std::string ck = save_checkpoint_dir(out, 1, *g_world, write);
  EXPECT_EQ(ck, out + "/checkpoint-1");
  if (g_world->rank() == 0) {
    EXPECT_NO_THROW(verify_checkpoint(ck));  // checksums combined from every rank's share match one pass
    EXPECT_EQ(find_latest_checkpoint(out, true), ck);
  }
  // a failure on the last rank only, after the collective writes: every rank throws, nothing half-made
  const int last = g_world->size() - 1;
  expect_error_everywhere(
      [&] {
        save_checkpoint_dir(out, 2, *g_world, [&](const std::string& dir) {
          write(dir);
          if (g_world->rank() == last) fail("model.safetensors: write failed: No space left on device");
        });
      },
      {"checkpoint-2", "No space left"}, "one rank fails");
  g_world->barrier();
  if (g_world->rank() == 0) {
    EXPECT_FALSE(fs::exists(out + "/checkpoint-2"));
    for (auto& e : fs::directory_iterator(out))
      EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
    EXPECT_EQ(find_latest_checkpoint(out, true), ck);
  }
  // and it resumes
  TrainRun b(cfg, *g_world, Strategy::full_shard, g_local_size);
  b.load(find_latest_checkpoint(out) + "/state.h5");
  expect_bitwise(gather_state(b), gather_state(a), "resumed from the checkpoint directory");
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<ControlComm> world;
  LaunchInfo info = init_launch(&argc, &argv, &world);
  g_world = world.get();
  g_local_size = info.local_size;
  if (const char* d = std::getenv("LLMT_TEST_DEVICE")) g_device = d;
  if (world->rank() == 0) {
    char tmpl[] = "/tmp/llmt_ckpt_mpi_XXXXXX";
    g_dir = mkdtemp(tmpl) ? tmpl : "";
  }
  int32_t len = (int32_t)g_dir.size();
  world->broadcast(&len, 1, DType::i32, 0);
  std::vector<int32_t> buf((size_t)len / 4 + 1, 0);
  std::memcpy(buf.data(), g_dir.data(), g_dir.size());
  world->broadcast(buf.data(), (int64_t)buf.size(), DType::i32, 0);
  g_dir.assign((const char*)buf.data(), (size_t)len);
  int rc = RUN_ALL_TESTS();
  double failed = world->all_reduce_sum(rc != 0 ? 1.0 : 0.0);
  world->barrier();
  if (world->rank() == 0) fs::remove_all(g_dir);
  world.reset();
  finalize_launch();
  return failed > 0 ? 1 : 0;
}
