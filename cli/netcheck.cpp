#include "engine/diag/netcheck.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "cli/commands.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/diag/nccl_log.h"
#include "engine/dist/agree.h"
#include "engine/dist/launch.h"
#include "engine/dist/mpi_communicator.h"
#include "kernels/cuda/cuda_backend.h"
#include "train/flags.h"
#include "train/output_path.h"
#include "train/plan.h"

namespace llmt {

namespace {

// Files named by --nccl_log: a comma-separated list of files and directories (every file inside).
std::vector<std::string> read_log_lines(const std::string& spec) {
  std::vector<std::string> files;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    std::string p = spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? spec.size() + 1 : comma + 1;
    if (p.empty()) continue;
    struct stat st;
    LLMT_CHECK(::stat(p.c_str(), &st) == 0, "netcheck --nccl_log: %s does not exist", p.c_str());
    if (S_ISDIR(st.st_mode)) {
      std::vector<std::string> inside;
      if (DIR* d = opendir(p.c_str())) {
        while (dirent* e = readdir(d))
          if (e->d_name[0] != '.') inside.push_back(p + "/" + e->d_name);
        closedir(d);
      }
      std::sort(inside.begin(), inside.end());
      files.insert(files.end(), inside.begin(), inside.end());
    } else {
      files.push_back(p);
    }
  }
  std::vector<std::string> lines;
  for (const std::string& f : files) {
    std::ifstream in(f);
    LLMT_CHECK(in.good(), "netcheck --nccl_log: cannot read %s", f.c_str());
    std::string line;
    while (std::getline(in, line)) lines.push_back(line);
  }
  return lines;
}

}  // namespace

int cli_netcheck(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::printf(
        "llmt netcheck: the network as NCCL will see it, on every rank, and the settings that follow\n"
        "run it alone, or under the same launcher as training: mpirun -hostfile H llmt netcheck / srun llmt "
        "netcheck\n\n"
        "  (no flag)            report: RDMA ports and GID tables, interfaces, GPUs, NCCL, memlock per node;\n"
        "                       differences between nodes; recommended NCCL_* settings; warnings\n"
        "  --write-env FILE     also write the recommended settings as KEY=value lines (e.g. .llmt_env)\n"
        "  --strict             exit 3 when there are warnings\n"
        "  --sysfs_root DIR     read sysfs below DIR instead of /sys (default $LLMT_SYSFS_ROOT or /sys)\n"
        "  --bench              time all_gather, reduce_scatter, all_reduce over the data communicator instead:\n"
        "    --min_bytes N (8)  --max_bytes N (1073741824)  --iters N (20)  --warmup N (5)  --json\n"
        "  --nccl_log F[,F..]   which transports NCCL chose, from NCCL_DEBUG=INFO output (files or directories,\n"
        "                       e.g. what NCCL_DEBUG_FILE=/tmp/nccl.%%h.%%p wrote); needs no launcher\n");
    return 0;
  }
  Flags flags("netcheck", args);
  const std::string write_env = flags.get_string("write_env", "");
  const bool strict = flags.get_bool("strict", false);
  const std::string root = flags.get_string("sysfs_root", sysfs_root());
  const bool bench = flags.get_bool("bench", false);
  BenchArgs b;
  b.min_bytes = flags.get_int64("min_bytes", b.min_bytes);
  b.max_bytes = flags.get_int64("max_bytes", b.max_bytes);
  b.iters = flags.get_int("iters", b.iters);
  b.warmup = flags.get_int("warmup", b.warmup);
  const bool json = flags.get_bool("json", false);
  const std::string nccl_log = flags.get_string("nccl_log", "");
  flags.finish();
  LLMT_CHECK(bench || !json, "llmt netcheck: --json goes with --bench");
  // before the ranks start: an argument error is the same on every rank
  LLMT_CHECK(b.min_bytes >= 4 && b.max_bytes >= b.min_bytes && b.iters > 0 && b.warmup >= 0,
             "llmt netcheck --bench: need 4 <= --min_bytes <= --max_bytes, --iters > 0, --warmup >= 0 (got %lld, "
             "%lld, %d, %d)",
             (long long)b.min_bytes, (long long)b.max_bytes, b.iters, b.warmup);

  // only rank 0 writes it (a node other than rank 0's may lack its directory), so only rank 0 checks
  if (launcher_rank_from_env() <= 0) check_output_path("llmt netcheck", {"--write-env", write_env}, OutputKind::file);

  if (!nccl_log.empty()) {
    NcclLogSummary s = parse_nccl_logs(read_log_lines(nccl_log));
    std::printf("%s", format_nccl_summary(s).c_str());
    return strict && !s.warnings.empty() ? 3 : 0;
  }

  std::unique_ptr<ControlComm> world;
  LaunchInfo launch = init_launch(nullptr, nullptr, &world, "netcheck");
  if (bench) {
    if (launch.world == 1) log_info("netcheck --bench: one rank: nothing crosses a network (run it under mpirun)");
    // the benchmark holds a buffer of --max_bytes and a 1/n slice of it: 99999999999999 ended in
    // "internal error: std::bad_alloc", naming neither
    std::string where;
    const double need_gib = (double)b.max_bytes * (1.0 + 1.0 / launch.world) / (1024.0 * 1024.0 * 1024.0);
    const double have_gib = memory_per_rank_gib(nullptr, launch.local_rank, launch.local_size, &where);
    agree_or_throw(*world, have_gib <= 0 || need_gib <= have_gib,
                   strformat("llmt netcheck --bench: --max_bytes %lld needs %.2f GiB per rank (the buffer and a "
                             "1/%d slice of it), and %s; lower --max_bytes", (long long)b.max_bytes, need_gib,
                             launch.world, where.c_str()));
    std::unique_ptr<DataComm> data = make_mpi_data_comm(*world);
    std::vector<BenchRow> rows = run_collective_bench(*data, *world, b);
    if (launch.rank == 0) {
      if (json)
        std::printf("%s\n", format_bench_json(rows, launch.world).c_str());
      else
        std::printf("%s", format_bench_table(rows, launch.world).c_str());
      std::fflush(stdout);
    }
    // a wrong value means the communicator itself is broken: fail (the count is the same on every rank)
    for (const BenchRow& r : rows)
      if (r.wrong) return 1;
    return 0;
  }

  RankReport mine = probe_node(root);
  mine.rank = launch.rank;
  mine.world = launch.world;
  mine.node = launch.node;
  mine.local_rank = launch.local_rank;
  mine.local_size = launch.local_size;
  mine.launcher = launch.launcher;
  mine.cuda_built = std::string(cuda_build_kind()) != "none";
  if (mine.cuda_built) {
    int ndev = cuda_device_count();
    if (ndev == 0) mine.cuda.push_back(cuda_device_description(0));
    for (int d = 0; d < ndev; d++) mine.cuda.push_back(cuda_device_description(d));
  }
  std::vector<std::string> texts = gather_strings(*world, report_to_json(mine));
  int rc = 0;
  if (launch.rank == 0) {
    std::vector<RankReport> reports;
    for (const std::string& t : texts) reports.push_back(report_from_json(t));
    Analysis a = analyze(reports);
    std::printf("%s", a.text.c_str());
    if (!write_env.empty()) {
      std::ofstream f(write_env);
      LLMT_CHECK(f.good(), "netcheck --write-env: cannot write %s", write_env.c_str());
      f << format_env_file(a);
      f.close();
      LLMT_CHECK(f.good(), "netcheck --write-env: writing %s failed", write_env.c_str());
      std::printf("wrote %s\n", write_env.c_str());
    }
    std::fflush(stdout);
    if (strict && !a.warnings.empty()) rc = 3;
  }
  world->barrier();
  return rc;
}

}  // namespace llmt
