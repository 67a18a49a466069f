// Reads NCCL's NCCL_DEBUG=INFO output (NCCL_DEBUG_FILE=dir/nccl.%h.%p writes one file per process)
// and says which transport NCCL chose on each rank: between nodes NET/IB with GPUDirect RDMA
// (GDRDMA), NET/IB through host memory, NET/Socket (no RDMA at all), another network plugin; within
// a node P2P (NVLink/PCIe) or SHM. Line formats are those of NCCL 2.18-2.23, e.g.
//   host:1234:1290 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
//   host:1234:1290 [1] NCCL INFO Channel 00/0 : 1[1] -> 8[0] [send] via NET/IB/0/GDRDMA
//   host:1234:1290 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/IB ; OOB eth0:10.0.0.1<0>
// The trainer calls summarize_nccl_logs after its NCCL communicators are up; `llmt netcheck
// --nccl_log FILES` does the same for files from any NCCL program.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace llmt {

enum class NcclPath {
  net_ib_gdr,        // NET/IB.../GDRDMA: RDMA straight to and from GPU memory
  net_ib,            // NET/IB without GDRDMA: RDMA through a bounce buffer in host memory
  net_socket,        // NET/Socket: TCP, no RDMA
  net_plugin,        // another NET plugin (AWS Libfabric, GPUDirectTCPX, ...), GDR or not
  p2p,               // P2P/CUMEM, P2P/IPC, P2P/direct pointer, P2P/indirect: NVLink or PCIe within a node
  nvlink_multinode,  // P2P/MNNVL: NVLink across nodes (GB200 NVL systems)
  shm,               // SHM: through host shared memory within a node
  collnet,           // CollNet (SHARP in-network reduction)
  count
};
const char* nccl_path_name(NcclPath p);

// One "Channel ... via ..." (or "CollNet ... via ...") line.
struct NcclConnection {
  int channel = -1;
  int from = -1, to = -1;  // communicator ranks; for CollNet both are the reporting rank
  std::string direction;   // "send", "receive" or "" (P2P and SHM lines name no direction)
  std::string via;         // the text after "via ", e.g. "NET/IB/0/GDRDMA"
  NcclPath path = NcclPath::count;
  bool gdr = false;
  std::string net_name;  // for NET lines: "IB", "Socket", "AWS Libfabric", ...
  // The rank that wrote the line: the receiver for [receive] lines, else the sender.
  int reporter() const { return direction == "receive" ? to : from; }
};

// Parses the message of a channel/collnet line (the NCCL prefix may be present or not).
bool parse_nccl_connection(const std::string& line, NcclConnection* out);

// What one rank (one process) reported.
struct NcclRankSummary {
  int rank = -1;               // communicator rank, -1 when no line names it
  std::string process;         // "host:pid" from the line prefix, "" without one
  std::string version;         // "2.21.5+cuda12.4"
  std::string network;         // "IB", "Socket", "AWS Libfabric" (from "Using network X")
  std::string ib_devices;      // "[0]mlx5_0:1/RoCE [1]mlx5_1:1/IB"
  std::string oob;             // "eth0:10.0.0.1<0>"
  std::string socket_devices;  // "[0]eth0:10.0.0.1<0>"
  int nranks = 0, nnodes = 0, local_ranks = 0;
  int counts[(int)NcclPath::count] = {};
  std::vector<std::string> warnings;  // NCCL's own WARN lines
};

struct NcclLogSummary {
  std::vector<NcclRankSummary> ranks;  // in rank order (unknown ranks last)
  std::vector<std::string> warnings;   // llmt's verdicts: socket between nodes, IB without GDR, ...
  bool any_net = false;                // some connection crossed nodes
};

NcclLogSummary parse_nccl_logs(const std::vector<std::string>& lines);
// A few lines per rank and the verdicts, for the trainer's log and netcheck.
std::string format_nccl_summary(const NcclLogSummary& s);
std::string summarize_nccl_logs(const std::vector<std::string>& lines);

// NCCL_DEBUG_FILE as NCCL expands it: %h the hostname up to its first '.', %p the pid, %% a '%'.
std::string expand_nccl_debug_file(const std::string& pattern, const std::string& host, int pid);
// This process's NCCL log file ($NCCL_DEBUG_FILE expanded), "" when NCCL_DEBUG_FILE is unset; the
// trainer reads it back after its communicators are up and gathers the summaries on rank 0.
std::string nccl_debug_file_path();
std::vector<std::string> read_text_lines(const std::string& path);  // empty when unreadable

}  // namespace llmt
