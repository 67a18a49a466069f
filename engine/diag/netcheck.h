// `llmt netcheck`: what each rank's node offers for NCCL (RDMA ports and their GID tables, network
// interfaces, GPUs and their PCIe distance to the NICs, the NCCL library, the memlock limit), and the
// NCCL settings that follow from it. Everything testable reads sysfs below a replaceable root
// (default "/sys", or $LLMT_SYSFS_ROOT), so the tests build fake trees; libibverbs
// (engine/diag/ibverbs.h) is only a cross-check on the real one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace llmt {

class ControlComm;
class DataComm;
struct LaunchInfo;

// ---- what one node has ----

struct GidEntry {
  int index = 0;
  std::string gid;   // as sysfs writes it: 8 groups of 4 hex digits, "0000:...:ffff:0a00:0001"
  std::string type;  // gid_attrs/types/<i>: "IB/RoCE v1", "RoCE v2", or "" (InfiniBand ports have none)
  std::string ndev;  // gid_attrs/ndevs/<i>: the net device behind a RoCE GID, "" for InfiniBand
};

struct RdmaPort {
  int port = 1;
  std::string state;           // "ACTIVE", "DOWN", "INIT", ... (from "4: ACTIVE")
  std::string phys_state;      // "LinkUp", "Disabled", ...
  std::string link_layer;      // "InfiniBand" or "Ethernet" (RoCE)
  std::string rate;            // "200 Gb/sec (4X HDR)"
  int gid_tbl_len = 0;         // entries in gids/ (populated or not)
  std::vector<GidEntry> gids;  // the populated (non-zero) entries
  bool active() const { return state == "ACTIVE"; }
  bool roce() const { return link_layer == "Ethernet"; }
};

struct RdmaDevice {
  std::string name;      // "mlx5_0"
  std::string hca_type;  // "MT4129"
  std::string fw_ver;
  std::string pci;  // PCI path below /sys/devices, e.g. "pci0000:17/0000:17:01.0/0000:18:00.0"
  int numa_node = -1;
  std::vector<std::string> netdevs;  // device/net/*: eth2, ib0, ...
  std::vector<RdmaPort> ports;
};

struct NetInterface {
  std::string name;
  std::string family;   // "ipv4", "ipv6"
  std::string address;  // "10.0.0.1", "fd00::1"
  int prefix_len = 0;
  bool up = false, loopback = false;
};

struct GpuPci {
  std::string bdf;  // "0000:18:00.0"
  std::string pci;  // path below /sys/devices, as RdmaDevice::pci
  int numa_node = -1;
};

struct RankReport {
  int rank = 0, world = 1, node = 0, local_rank = 0, local_size = 1;
  std::string hostname, launcher;
  std::vector<RdmaDevice> rdma;
  bool sysfs_infiniband = false;  // <root>/class/infiniband exists
  std::string verbs;              // the libibverbs cross-check, one line
  std::vector<std::string> verbs_mismatches;
  std::vector<NetInterface> ifaces;
  std::vector<GpuPci> gpus;       // NVIDIA devices on the PCI bus
  std::vector<std::string> cuda;  // cuda_device_description lines when built with CUDA
  bool cuda_built = false;
  std::string nccl_version;                                   // "2.21.5" or "not found"
  std::string nccl_path;                                      // the library that was loaded
  bool peermem = false;                                       // nvidia_peermem / nv_peer_mem loaded (GPUDirect RDMA)
  int64_t memlock_soft = -1, memlock_hard = -1;               // bytes; -1 = unlimited
  std::vector<std::pair<std::string, std::string>> nccl_env;  // NCCL_* and UCX_* as this rank sees them
};

// ---- reading a node (sysfs below `root`) ----

std::string sysfs_root();  // $LLMT_SYSFS_ROOT or "/sys"
std::vector<RdmaDevice> read_rdma_devices(const std::string& root);
std::vector<GpuPci> read_nvidia_gpus(const std::string& root);
bool read_peermem_loaded(const std::string& root);
std::vector<NetInterface> read_interfaces();  // getifaddrs
// Everything but the CUDA lines and the launch fields.
RankReport probe_node(const std::string& root);

// ---- the decisions, pure functions over reports ----

// NCCL 2.21+'s own GID choice for a RoCE port (ncclIbGetGidIndex with its defaults: AF_INET, RoCE v2,
// no address range): the IPv4-mapped RoCE v2 entry when there is one. -1 when the table is empty.
int nccl_gid_index(const RdmaPort& port);
bool gid_is_ipv4_mapped(const std::string& gid);
// "::ffff:10.0.0.1" style text for a sysfs GID
std::string gid_to_text(const std::string& gid);

// The exact list of active ports, "=mlx5_0:1,mlx5_1:1", of the one link layer NCCL can use together.
std::string nccl_ib_hca_list(const std::vector<RdmaDevice>& devs, const std::string& link_layer);
// Problems with a user's NCCL_IB_HCA against this node's devices: names that match no device, and
// prefixes that match more than the device named (mlx5_1 matches mlx5_10..mlx5_19 without '=').
std::vector<std::string> check_nccl_ib_hca(const std::string& value, const std::vector<RdmaDevice>& devs);

// PCIe distance in NCCL's words: "PIX", "PXB", "PHB", "SYS".
std::string pci_distance(const std::string& pci_a, int numa_a, const std::string& pci_b, int numa_b);

struct Setting {
  std::string key, value;
  std::string why;
  bool write = true;  // false: shown, and written commented out
};

struct Analysis {
  std::vector<Setting> settings;
  std::vector<std::string> warnings;
  std::vector<std::string> notes;
  std::string text;  // the whole report
};

// Rank 0's view of every rank's report (in rank order).
Analysis analyze(const std::vector<RankReport>& ranks);
// KEY=value lines with the why as comments, for .llmt_env.
std::string format_env_file(const Analysis& a);

// JSON text for the gather, and back.
std::string report_to_json(const RankReport& r);
RankReport report_from_json(const std::string& text);

// Every rank's JSON text on rank 0 (others get an empty vector). Collective.
std::vector<std::string> gather_strings(ControlComm& comm, const std::string& mine);

// ---- the collective benchmark ----

enum class BenchOp { all_gather, reduce_scatter, all_reduce };
const char* bench_op_name(BenchOp op);
// nccl-tests' conventions: `bytes` is the size column (all_gather: the gathered output; reduce_scatter:
// the full input; all_reduce: the buffer), algbw = bytes / time, busbw = algbw * (n-1)/n for
// all_gather and reduce_scatter and * 2(n-1)/n for all_reduce. GB/s are 1e9 bytes per second.
double bench_busbw_factor(BenchOp op, int nranks);
// The element count nccl-tests uses for a size: f32 elements, rounded down to a multiple of nranks
// for all_gather and reduce_scatter.
int64_t bench_count(BenchOp op, int64_t bytes, int nranks);

struct BenchRow {
  BenchOp op;
  int64_t bytes = 0, count = 0;
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = 0;
};

struct BenchArgs {
  int64_t min_bytes = 8, max_bytes = int64_t(1) << 30;
  int iters = 20, warmup = 5;
};

// Runs every op over sizes min_bytes, 2*min_bytes, ... max_bytes; collective; rows on every rank.
std::vector<BenchRow> run_collective_bench(DataComm& comm, ControlComm& control, const BenchArgs& a);
std::string format_bench_table(const std::vector<BenchRow>& rows, int nranks);
std::string format_bench_json(const std::vector<BenchRow>& rows, int nranks);

}  // namespace llmt
