#include "engine/diag/nccl_log.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>

#include "engine/core/error.h"

namespace llmt {

const char* nccl_path_name(NcclPath p) {
  switch (p) {
    case NcclPath::net_ib_gdr: return "NET/IB+GDRDMA";
    case NcclPath::net_ib: return "NET/IB (no GDR)";
    case NcclPath::net_socket: return "NET/Socket";
    case NcclPath::net_plugin: return "NET/plugin";
    case NcclPath::p2p: return "P2P";
    case NcclPath::nvlink_multinode: return "P2P/MNNVL";
    case NcclPath::shm: return "SHM";
    case NcclPath::collnet: return "CollNet";
    case NcclPath::count: break;
  }
  return "?";
}

namespace {

// Splits "host:pid:tid [dev] NCCL INFO message" into the process ("host:pid"), the level and the
// message. A line without NCCL's prefix is taken as a bare message.
void split_prefix(const std::string& line, std::string* process, std::string* level, std::string* msg) {
  process->clear();
  level->clear();
  size_t at = std::string::npos, len = 0;
  for (const char* lv : {"NCCL INFO ", "NCCL WARN "}) {
    size_t p = line.find(lv);
    if (p != std::string::npos && p < at) at = p, len = std::char_traits<char>::length(lv), *level = lv + 5;
  }
  if (at == std::string::npos) {
    *msg = line;
    return;
  }
  level->pop_back();  // "INFO " -> "INFO"
  *msg = line.substr(at + len);
  // host:pid:tid is the first word; hostnames have no ':' and no spaces
  std::string head = line.substr(0, at);
  size_t start = head.find_first_not_of(" \t\r\n");
  if (start == std::string::npos) return;
  size_t end = head.find(' ', start);
  std::string word = head.substr(start, end == std::string::npos ? std::string::npos : end - start);
  size_t c1 = word.find(':');
  size_t c2 = c1 == std::string::npos ? std::string::npos : word.find(':', c1 + 1);
  if (c1 != std::string::npos && c2 != std::string::npos) *process = word.substr(0, c2);
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

NcclPath classify(const std::string& via, bool* gdr, std::string* net_name) {
  *gdr = false;
  net_name->clear();
  if (via.compare(0, 4, "NET/") == 0) {
    // NET/<plugin name>/<dev>[(<proxy rank>)][/GDRDMA][/Shared]; plugin names may hold spaces
    // ("AWS Libfabric") but not '/'
    size_t slash = via.find('/', 4);
    *net_name = via.substr(4, slash == std::string::npos ? std::string::npos : slash - 4);
    *gdr = via.find("/GDRDMA") != std::string::npos;
    // NCCL's own IB transport is "IB"; the SHARP/HPC-X plugin calls itself "IBext", "IBext_v8", ...
    if (net_name->compare(0, 2, "IB") == 0) return *gdr ? NcclPath::net_ib_gdr : NcclPath::net_ib;
    if (*net_name == "Socket") return NcclPath::net_socket;
    return NcclPath::net_plugin;
  }
  if (via.compare(0, 9, "P2P/MNNVL") == 0) return NcclPath::nvlink_multinode;
  if (via.compare(0, 4, "P2P/") == 0) return NcclPath::p2p;
  if (via.compare(0, 4, "SHM/") == 0) return NcclPath::shm;
  if (via.compare(0, 8, "COLLNET/") == 0) {
    *gdr = via.find("/GDRDMA") != std::string::npos;
    return NcclPath::collnet;
  }
  return NcclPath::count;
}

int to_int(const std::string& s) { return std::atoi(s.c_str()); }

}  // namespace

bool parse_nccl_connection(const std::string& line, NcclConnection* out) {
  // Channel 00/0 : 1[1] -> 8[0] [send] via NET/IB/0/GDRDMA      (2.12+; SHM lines have no "/conn")
  // Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
  // Channel 00 : 0[0] -> 1[1] via SHM/direct/direct
  // Before 2.12 the [x] after a rank was the bus id in hex: 0[1b000].
  static const std::regex channel(
      R"(Channel (\d+)(?:/(\d+))? : (\d+)\[[0-9a-fA-F]+\] -> (\d+)\[[0-9a-fA-F]+\] (?:\[(send|receive)\] )?via (.+)$)");
  // CollNet 00/0 : 3 [send] via COLLNET/SHARP/0/GDRDMA
  static const std::regex collnet(R"(CollNet (\d+)(?:/(\d+))? : (\d+) \[(send|receive)\] via (.+)$)");
  std::string process, level, msg;
  split_prefix(line, &process, &level, &msg);
  msg = trim(msg);
  std::smatch m;
  NcclConnection c;
  if (std::regex_search(msg, m, channel)) {
    c.channel = to_int(m[1]);
    c.from = to_int(m[3]);
    c.to = to_int(m[4]);
    c.direction = m[5];
    c.via = trim(m[6]);
  } else if (std::regex_search(msg, m, collnet)) {
    c.channel = to_int(m[1]);
    c.from = c.to = to_int(m[3]);
    c.direction = m[4];
    c.via = trim(m[5]);
  } else {
    return false;
  }
  c.path = classify(c.via, &c.gdr, &c.net_name);
  if (c.path == NcclPath::count) return false;
  *out = c;
  return true;
}

NcclLogSummary parse_nccl_logs(const std::vector<std::string>& lines) {
  static const std::regex version(R"(NCCL version (\S+))");
  static const std::regex network(R"(Using network (.+)$)");
  static const std::regex ib_using(R"(NET/IB : Using(.*?)\s*(?:\[RO\])?\s*; OOB (\S+))");
  static const std::regex socket_using(R"(NET/Socket : Using(.*)$)");
  // 2.20+: "comm 0x.. rank 3 nRanks 16 nNodes 2 localRanks 8 localRank 3 MNNVL 0";
  // every version: "comm 0x.. rank 3 nranks 16 cudaDev 3 ... - Init COMPLETE"
  static const std::regex comm_line(
      R"(comm 0x[0-9a-fA-F]+ rank (\d+) n[Rr]anks (\d+)(?: nNodes (\d+) localRanks (\d+))?)");

  std::map<std::string, NcclRankSummary> procs;  // by "host:pid", or by "rank N" for bare lines
  std::vector<std::string> order;
  auto get = [&](const std::string& key) -> NcclRankSummary& {
    auto it = procs.find(key);
    if (it != procs.end()) return it->second;
    order.push_back(key);
    return procs[key];
  };
  std::string last_process;  // bare lines (no prefix) are credited to the process seen last
  for (const std::string& raw : lines) {
    std::string process, level, msg;
    split_prefix(raw, &process, &level, &msg);
    msg = trim(msg);
    if (msg.empty()) continue;
    NcclConnection c;
    if (parse_nccl_connection(msg, &c)) {
      std::string key = !process.empty() ? process : "rank " + std::to_string(c.reporter());
      NcclRankSummary& r = get(key);
      r.process = process;
      if (r.rank < 0 && (process.empty() || c.path != NcclPath::collnet)) r.rank = c.reporter();
      r.counts[(int)c.path]++;
      continue;
    }
    if (process.empty() && level.empty() && last_process.empty()) continue;  // not NCCL's output
    if (!process.empty()) last_process = process;
    NcclRankSummary& r = get(process.empty() ? last_process : process);
    r.process = process.empty() ? last_process : process;
    std::smatch m;
    if (level == "WARN") {
      r.warnings.push_back(msg);
    } else if (std::regex_search(msg, m, version)) {
      r.version = m[1];
    } else if (std::regex_search(msg, m, ib_using)) {
      r.ib_devices = trim(m[1]);
      r.oob = m[2];
    } else if (std::regex_search(msg, m, socket_using)) {
      r.socket_devices = trim(m[1]);
    } else if (msg.find("NET/IB : No device found") != std::string::npos) {
      r.ib_devices = "none";
    } else if (std::regex_search(msg, m, network)) {
      r.network = trim(m[1]);
    } else if (std::regex_search(msg, m, comm_line)) {
      // the first communicator a process creates is the world; keep its numbers
      if (r.nranks == 0) {
        r.rank = to_int(m[1]);
        r.nranks = to_int(m[2]);
        if (m[3].matched) r.nnodes = to_int(m[3]), r.local_ranks = to_int(m[4]);
      }
    }
  }

  NcclLogSummary s;
  for (const std::string& k : order) s.ranks.push_back(procs[k]);
  std::stable_sort(s.ranks.begin(), s.ranks.end(), [](const NcclRankSummary& a, const NcclRankSummary& b) {
    return (unsigned)a.rank < (unsigned)b.rank;  // -1 sorts last
  });
  auto who = [](const NcclRankSummary& r) {
    std::string w = r.rank >= 0 ? "rank " + std::to_string(r.rank) : "a process";
    if (!r.process.empty()) w += " (" + r.process + ")";
    return w;
  };
  int total_links = 0;
  for (const NcclRankSummary& r : s.ranks) {
    const int* n = r.counts;
    for (int i = 0; i < (int)NcclPath::count; i++) total_links += n[i];
    int net = n[(int)NcclPath::net_ib_gdr] + n[(int)NcclPath::net_ib] + n[(int)NcclPath::net_socket] +
              n[(int)NcclPath::net_plugin];
    if (net) s.any_net = true;
    if (n[(int)NcclPath::net_socket])
      s.warnings.push_back(who(r) + ": " + std::to_string(n[(int)NcclPath::net_socket]) +
                           " connections over NET/Socket (TCP): no RDMA between nodes. NCCL found no usable HCA "
                           "(NCCL_IB_DISABLE=1, an NCCL_IB_HCA that matches nothing, ports down, or /dev/infiniband "
                           "missing in the container); run `llmt netcheck` on these nodes");
    if (n[(int)NcclPath::net_ib])
      s.warnings.push_back(who(r) + ": " + std::to_string(n[(int)NcclPath::net_ib]) +
                           " NET/IB connections without GPUDirect RDMA (staged through host memory): load "
                           "nvidia_peermem (or use DMA-BUF), or raise NCCL_NET_GDR_LEVEL when GPU and NIC are "
                           "farther apart than a PCIe switch");
    if (n[(int)NcclPath::shm] && !n[(int)NcclPath::p2p])
      s.warnings.push_back(who(r) +
                           ": GPUs on this node talk through SHM (host memory), not P2P: check "
                           "NCCL_P2P_DISABLE, `nvidia-smi topo -m`, and that the container runs with --ipc=host");
  }
  if (total_links == 0)
    s.warnings.push_back(
        "no \"Channel ... via\" lines: run with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS must include "
        "INIT or NET) and let the first collective complete");
  return s;
}

std::string format_nccl_summary(const NcclLogSummary& s) {
  std::string out;
  for (const NcclRankSummary& r : s.ranks) {
    out += r.rank >= 0 ? strformat("rank %d", r.rank) : std::string("rank ?");
    if (!r.process.empty()) out += " " + r.process;
    if (!r.version.empty()) out += ", NCCL " + r.version;
    if (!r.network.empty()) out += ", network " + r.network;
    if (r.nnodes) out += strformat(", %d ranks on %d nodes", r.nranks, r.nnodes);
    out += "\n";
    if (!r.ib_devices.empty())
      out += "  NET/IB devices: " + r.ib_devices + (r.oob.empty() ? "" : ", OOB " + r.oob) + "\n";
    if (!r.socket_devices.empty()) out += "  NET/Socket devices: " + r.socket_devices + "\n";
    auto list = [&](std::initializer_list<NcclPath> paths) {
      std::string l;
      for (NcclPath p : paths)
        if (r.counts[(int)p]) l += strformat("%s%s x%d", l.empty() ? "" : ", ", nccl_path_name(p), r.counts[(int)p]);
      return l.empty() ? std::string("none") : l;
    };
    out += "  between nodes: " +
           list({NcclPath::net_ib_gdr, NcclPath::net_ib, NcclPath::net_socket, NcclPath::net_plugin,
                 NcclPath::nvlink_multinode, NcclPath::collnet}) +
           "\n";
    out += "  within a node: " + list({NcclPath::p2p, NcclPath::shm}) + "\n";
    for (const std::string& w : r.warnings) out += "  NCCL WARN " + w + "\n";
  }
  for (const std::string& w : s.warnings) out += "warning: " + w + "\n";
  return out;
}

std::string summarize_nccl_logs(const std::vector<std::string>& lines) {
  return format_nccl_summary(parse_nccl_logs(lines));
}

std::string expand_nccl_debug_file(const std::string& pattern, const std::string& host, int pid) {
  std::string out, short_host = host.substr(0, host.find('.'));
  for (size_t i = 0; i < pattern.size(); i++) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    char c = pattern[++i];
    if (c == '%')
      out += '%';
    else if (c == 'h')
      out += short_host;
    else if (c == 'p')
      out += std::to_string(pid);
    else
      out += std::string("%") + c;  // NCCL echoes what it does not know
  }
  return out;
}

std::string nccl_debug_file_path() {
  const char* p = std::getenv("NCCL_DEBUG_FILE");
  if (!p || !*p) return "";
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return expand_nccl_debug_file(p, host, (int)getpid());
}

std::vector<std::string> read_text_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

}  // namespace llmt
