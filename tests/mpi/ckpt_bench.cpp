// Checkpoint speed under mpirun: saves and loads the training state (master, Adam m and v: 12 bytes
// per parameter) of real-sized presets through parallel HDF5, commits the checkpoint directory
// (checksums, fsync, rename), and prints GB/s beside the raw disk speed measured by dd in the same
// directory. The load is cold: the file is dropped from the page cache first. The round trip is
// checked (CRC-32C of every shard before the save and after the load).
//
// The disk is measured beside every save: dd writes as many bytes as the state with conv=fdatasync
// (page cache, then a sync: the path the save takes) just before it, so a noisy shared disk is
// compared with itself; oflag=direct and iflag=direct (2 GiB) are printed once for reference.
//
//   mpirun -np 2 ckpt_bench [--dir /path/on/the/disk] [--presets gpt2,gpt2-large] [--reps 2] [--no-dd]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/train_state.h"
#include "engine/core/error.h"
#include "engine/dist/launch.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/fsdp/fsdp.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/config.h"
#include "models/layout.h"

using namespace llmt;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// "2147483648 bytes (2.1 GB, 2.0 GiB) copied, 1.04865 s, 2.0 GB/s" -> GB/s from bytes and seconds
double dd_gbps(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return 0;
  char line[512];
  double gbps = 0;
  while (std::fgets(line, sizeof(line), p)) {
    long long bytes = 0;
    double sec = 0;
    const char* c = std::strstr(line, "copied, ");
    if (c && std::sscanf(line, "%lld", &bytes) == 1 && std::sscanf(c + 8, "%lf", &sec) == 1 && sec > 0)
      gbps = (double)bytes / sec / 1e9;
  }
  pclose(p);
  return gbps;
}

uint32_t shard_crc(const FsdpStore& store, const ModelLayout& L) {
  uint32_t c = 0;
  for (size_t u = 0; u < L.units.size(); u++) {
    FsdpStore::ShardState s = store.shard_state((int)u);
    size_t n = (size_t)store.shard_numel((int)u) * sizeof(float);
    c = crc32c(c, s.master.data, n);
    c = crc32c(c, s.m.data, n);
    c = crc32c(c, s.v.data, n);
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<ControlComm> world;
  LaunchInfo info = init_launch(&argc, &argv, &world);
  std::string dir = "/tmp/llmt_ckpt_bench", presets = "gpt2,gpt2-large";
  bool dd = true;
  int reps = 2;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc)
      dir = argv[++i];
    else if (a == "--presets" && i + 1 < argc)
      presets = argv[++i];
    else if (a == "--no-dd")
      dd = false;
    else if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
  }
  const int W = world->size(), me = world->rank();
  int rc = 0;
  try {
    if (me == 0) {
      std::string mk = "mkdir -p " + dir;
      LLMT_CHECK(std::system(mk.c_str()) == 0, "cannot create %s", dir.c_str());
    }
    world->barrier();
    if (dd && me == 0) {
      std::string f = dir + "/dd.tmp";
      double w_direct = dd_gbps("dd if=/dev/zero of=" + f + " bs=1M count=2048 oflag=direct");
      double r_direct = dd_gbps("dd if=" + f + " of=/dev/null bs=1M iflag=direct");
      std::remove(f.c_str());
      std::printf("disk (dd, 2 GiB in %s): write %.2f GB/s (oflag=direct), read %.2f GB/s (iflag=direct)\n",
                  dir.c_str(), w_direct, r_direct);
    }
    auto be = make_cpu_backend(std::max(1, 2 / W));
    size_t pos = 0;
    while (pos <= presets.size()) {
      size_t end = presets.find(',', pos);
      if (end == std::string::npos) end = presets.size();
      std::string name = presets.substr(pos, end - pos);
      pos = end + 1;
      if (name.empty()) continue;
      ModelConfig cfg = config_from_preset(name);
      ModelLayout L = make_layout(cfg);
      std::unique_ptr<DataComm> data = make_mpi_data_comm(*world);
      FsdpStore store(*be, L, Strategy::full_shard, *data, info.local_size);
      for (size_t u = 0; u < L.units.size(); u++) {  // values that differ everywhere
        FsdpStore::ShardState s = store.shard_state((int)u);
        int64_t n = store.shard_numel((int)u);
#pragma omp parallel for
        for (int64_t i = 0; i < n; i++) {
          uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(u * 40503u + me * 977u);
          s.master.f32()[i] = (float)(h & 0xffff) * 1e-5f;
          s.m.f32()[i] = (float)(h >> 16) * 1e-7f;
          s.v.f32()[i] = (float)((h >> 8) & 0xffff) * 1e-9f;
        }
      }
      store.set_steps_done(100);
      uint32_t before = shard_crc(store, L);
      const double gb = 12.0 * (double)L.total_numel / 1e9;
      std::string cfg_json = config_to_hf_json(cfg).dump();
      std::string out = dir + "/" + name + "-np" + std::to_string(W);
      for (int rep = 0; rep < reps; rep++) {
        double dd_sync = 0;
        if (dd && me == 0) {
          std::string f = dir + "/dd.tmp";
          long long mib = (long long)(gb * 1e9 / 1048576);
          dd_sync = dd_gbps("dd if=/dev/zero of=" + f + " bs=1M count=" + std::to_string(mib) + " conv=fdatasync");
          std::remove(f.c_str());
        }
        world->barrier();
        double t0 = now(), t_state = 0;
        std::string ck = save_checkpoint_dir(out, 100, *world, [&](const std::string& d) {
          save_train_state(d + "/state.h5", *world, L, store, 100, "{}", cfg_json);
          world->barrier();
          t_state = now();
        });
        world->barrier();
        double t1 = now();
        // cold load: drop the (clean, synced) file from the page cache
        if (me == 0) {
          int fd = ::open((ck + "/state.h5").c_str(), O_RDONLY);
          posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
          ::close(fd);
        }
        for (size_t u = 0; u < L.units.size(); u++) {
          FsdpStore::ShardState s = store.shard_state((int)u);
          size_t n = (size_t)store.shard_numel((int)u) * sizeof(float);
          std::memset(s.master.data, 0, n), std::memset(s.m.data, 0, n), std::memset(s.v.data, 0, n);
        }
        world->barrier();
        double t2 = now();
        load_train_state(ck + "/state.h5", *world, L, store, cfg_json);
        world->barrier();
        double t3 = now();
        double ok = world->all_reduce_sum(shard_crc(store, L) == before ? 0.0 : 1.0);
        double t4 = now(), t5 = t4;
        if (me == 0) {
          verify_checkpoint(ck);
          t5 = now();
        }
        if (me == 0)
          std::printf(
              "%-10s %4.2fB params, %d rank%s, state %.2f GB: dd %.2f GB/s | save %.2f GB/s (%.0f%% of dd; state "
              "write+sync %.2f s, commit %.2f s) | cold load %.2f GB/s | verify %.2f s | round trip %s\n",
              name.c_str(), (double)L.total_numel / 1e9, W, W == 1 ? "" : "s", gb, dd_sync, gb / (t1 - t0),
              dd_sync > 0 ? 100.0 * gb / (t1 - t0) / dd_sync : 0.0, t_state - t0, t1 - t_state, gb / (t3 - t2), t5 - t4,
              ok == 0 ? "bitwise" : "DIFFERS");
        std::fflush(stdout);
        if (ok != 0) rc = 1;
        if (me == 0) remove_dir_tree(out);
        world->barrier();
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt_bench: %s\n", e.what());
    abort_job(1);
  }
  world.reset();
  finalize_launch();
  return rc;
}
