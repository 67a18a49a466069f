#include "engine/diag/netcheck.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/dist/communicator.h"
#include "engine/diag/ibverbs.h"

extern char** environ;

namespace llmt {

// ---------------------------------------------------------------- sysfs

namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// The first line of a sysfs file, trimmed; "" when it cannot be read (an unpopulated GID's type
// reads as EINVAL on a real system).
std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return "";
  return trim(line);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// "mlx5_2" before "mlx5_10", "9" before "10": digits compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit((unsigned char)a[i]) && std::isdigit((unsigned char)b[j])) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit((unsigned char)a[i2])) i2++;
      while (j2 < b.size() && std::isdigit((unsigned char)b[j2])) j2++;
      unsigned long long x = std::strtoull(a.substr(i, i2 - i).c_str(), nullptr, 10);
      unsigned long long y = std::strtoull(b.substr(j, j2 - j).c_str(), nullptr, 10);
      if (x != y) return x < y;
      i = i2, j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      i++, j++;
    }
  }
  return a.size() - i < b.size() - j;
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> names;
  DIR* d = opendir(path.c_str());
  if (!d) return names;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    names.push_back(e->d_name);
  }
  closedir(d);
  std::sort(names.begin(), names.end(), natural_less);
  return names;
}

// The PCI path of a device link below ".../devices/": "pci0000:17/0000:17:01.0/0000:18:00.0".
std::string pci_path_of(const std::string& link) {
  char buf[PATH_MAX];
  if (!realpath(link.c_str(), buf)) return "";
  std::string p = buf;
  size_t at = p.find("/devices/");
  if (at == std::string::npos) return "";
  p = p.substr(at + 9);
  return p.compare(0, 3, "pci") == 0 ? p : "";
}

int read_int(const std::string& path, int fallback) {
  std::string s = read_line(path);
  if (s.empty()) return fallback;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 0);
  return end && *end == 0 ? (int)v : fallback;
}

// "4: ACTIVE" -> "ACTIVE"
std::string after_colon(const std::string& s) {
  size_t c = s.find(':');
  return c == std::string::npos ? s : trim(s.substr(c + 1));
}

bool parse_gid(const std::string& text, uint8_t out[16]) {
  std::string hex;
  for (char c : text)
    if (c != ':') hex += c;
  if (hex.size() != 32) return false;
  for (int i = 0; i < 16; i++) {
    char b[3] = {hex[2 * i], hex[2 * i + 1], 0};
    char* end = nullptr;
    out[i] = (uint8_t)std::strtoul(b, &end, 16);
    if (*end) return false;
  }
  return true;
}

}  // namespace

std::string sysfs_root() {
  const char* e = std::getenv("LLMT_SYSFS_ROOT");
  return e && *e ? std::string(e) : std::string("/sys");
}

std::vector<RdmaDevice> read_rdma_devices(const std::string& root) {
  std::vector<RdmaDevice> devs;
  const std::string base = root + "/class/infiniband";
  for (const std::string& name : list_dir(base)) {
    RdmaDevice d;
    d.name = name;
    const std::string dir = base + "/" + name;
    d.hca_type = read_line(dir + "/hca_type");
    d.fw_ver = read_line(dir + "/fw_ver");
    d.pci = pci_path_of(dir + "/device");
    d.numa_node = read_int(dir + "/device/numa_node", -1);
    d.netdevs = list_dir(dir + "/device/net");
    for (const std::string& p : list_dir(dir + "/ports")) {
      RdmaPort port;
      port.port = std::atoi(p.c_str());
      const std::string pd = dir + "/ports/" + p;
      port.state = after_colon(read_line(pd + "/state"));
      port.phys_state = after_colon(read_line(pd + "/phys_state"));
      port.link_layer = read_line(pd + "/link_layer");
      port.rate = read_line(pd + "/rate");
      for (const std::string& gi : list_dir(pd + "/gids")) {
        int idx = std::atoi(gi.c_str());
        port.gid_tbl_len = std::max(port.gid_tbl_len, idx + 1);
        GidEntry g;
        g.index = idx;
        g.gid = read_line(pd + "/gids/" + gi);
        uint8_t raw[16];
        if (!parse_gid(g.gid, raw)) continue;
        // unpopulated entries read as zeros (or a bare fe80:: prefix): not worth carrying
        bool rest_zero = true;
        for (int i = 4; i < 16; i++) rest_zero = rest_zero && raw[i] == 0;
        bool head_zero = raw[0] == 0 && raw[1] == 0 && raw[2] == 0 && raw[3] == 0;
        bool fe80 = raw[0] == 0xfe && raw[1] == 0x80 && raw[2] == 0 && raw[3] == 0;
        if (rest_zero && (head_zero || fe80)) continue;
        g.type = read_line(pd + "/gid_attrs/types/" + gi);
        g.ndev = read_line(pd + "/gid_attrs/ndevs/" + gi);
        port.gids.push_back(g);
      }
      d.ports.push_back(port);
    }
    devs.push_back(d);
  }
  return devs;
}

std::vector<GpuPci> read_nvidia_gpus(const std::string& root) {
  std::vector<GpuPci> gpus;
  const std::string base = root + "/bus/pci/devices";
  for (const std::string& bdf : list_dir(base)) {
    const std::string dir = base + "/" + bdf;
    if (read_line(dir + "/vendor") != "0x10de") continue;
    std::string cls = read_line(dir + "/class");  // 0x030200 3D controller, 0x030000 VGA
    if (cls.compare(0, 6, "0x0302") != 0 && cls.compare(0, 6, "0x0300") != 0) continue;
    GpuPci g;
    g.bdf = bdf;
    g.pci = pci_path_of(dir);
    g.numa_node = read_int(dir + "/numa_node", -1);
    gpus.push_back(g);
  }
  return gpus;
}

bool read_peermem_loaded(const std::string& root) {
  return exists(root + "/module/nvidia_peermem") || exists(root + "/module/nv_peer_mem");
}

std::vector<NetInterface> read_interfaces() {
  std::vector<NetInterface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    int fam = a->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    NetInterface n;
    n.name = a->ifa_name;
    n.family = fam == AF_INET ? "ipv4" : "ipv6";
    n.up = (a->ifa_flags & IFF_UP) != 0;
    n.loopback = (a->ifa_flags & IFF_LOOPBACK) != 0;
    char buf[INET6_ADDRSTRLEN] = {0};
    const uint8_t* mask = nullptr;
    int mask_len = 0;
    if (fam == AF_INET) {
      inet_ntop(AF_INET, &((sockaddr_in*)a->ifa_addr)->sin_addr, buf, sizeof buf);
      if (a->ifa_netmask) mask = (const uint8_t*)&((sockaddr_in*)a->ifa_netmask)->sin_addr, mask_len = 4;
    } else {
      inet_ntop(AF_INET6, &((sockaddr_in6*)a->ifa_addr)->sin6_addr, buf, sizeof buf);
      if (a->ifa_netmask) mask = (const uint8_t*)&((sockaddr_in6*)a->ifa_netmask)->sin6_addr, mask_len = 16;
    }
    n.address = buf;
    for (int i = 0; i < mask_len; i++) n.prefix_len += __builtin_popcount(mask[i]);
    out.push_back(n);
  }
  freeifaddrs(list);
  return out;
}

namespace {

// NCCL's version from the library itself, so that netcheck reports what the trainer will load.
void read_nccl_version(std::string* version, std::string* path) {
  *version = "not found";
  path->clear();
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  using GetVersion = int (*)(int*);
  GetVersion get = reinterpret_cast<GetVersion>(dlsym(lib, "ncclGetVersion"));
  int code = 0;
  if (!get || get(&code) != 0) {
    *version = "unreadable (libnccl.so.2 without ncclGetVersion)";
    return;
  }
  // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + minor*100 + patch before
  int major = code >= 10000 ? code / 10000 : code / 1000;
  int minor = code >= 10000 ? code % 10000 / 100 : code % 1000 / 100;
  *version = strformat("%d.%d.%d", major, minor, code % 100);
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(get), &info) && info.dli_fname) *path = info.dli_fname;
}

int64_t limit_bytes(rlim_t v) { return v == RLIM_INFINITY ? -1 : (int64_t)v; }

void verbs_cross_check(RankReport* r) {
  VerbsProbe v = probe_verbs();
  if (!v.loaded) {
    r->verbs = v.error + " (verbs cross-check skipped; NCCL needs this library for RDMA)";
    return;
  }
  r->verbs = strformat("libibverbs: %zu device%s, %zu port%s queried", v.devices.size(),
                       v.devices.size() == 1 ? "" : "s", v.ports.size(), v.ports.size() == 1 ? "" : "s");
  if (!v.error.empty()) {
    // with no device in sysfs either, a failing device list just says the same: nothing there
    if (r->rdma.empty())
      r->verbs += " (" + v.error + ")";
    else
      r->verbs_mismatches.push_back(v.error);
  }
  for (const RdmaDevice& d : r->rdma) {
    if (std::find(v.devices.begin(), v.devices.end(), d.name) == v.devices.end()) {
      r->verbs_mismatches.push_back("sysfs shows " + d.name +
                                    " but libibverbs does not list it (is its provider, "
                                    "e.g. libmlx5, installed?)");
      continue;
    }
    for (const RdmaPort& p : d.ports) {
      for (const VerbsPort& vp : v.ports) {
        if (vp.device != d.name || vp.port != p.port) continue;
        if (p.state != verbs_port_state_name(vp.state) || p.link_layer != verbs_link_layer_name(vp.link_layer))
          r->verbs_mismatches.push_back(
              strformat("%s:%d: sysfs says %s %s, verbs says %s %s", d.name.c_str(), p.port, p.state.c_str(),
                        p.link_layer.c_str(), verbs_port_state_name(vp.state), verbs_link_layer_name(vp.link_layer)));
      }
    }
  }
}

}  // namespace

RankReport probe_node(const std::string& root) {
  RankReport r;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  r.hostname = host;
  r.sysfs_infiniband = exists(root + "/class/infiniband");
  r.rdma = read_rdma_devices(root);
  if (root == "/sys")
    verbs_cross_check(&r);
  else
    r.verbs = "verbs cross-check skipped (sysfs root " + root + ")";
  r.ifaces = read_interfaces();
  r.gpus = read_nvidia_gpus(root);
  r.peermem = read_peermem_loaded(root);
  read_nccl_version(&r.nccl_version, &r.nccl_path);
  rlimit lim;
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
    r.memlock_soft = limit_bytes(lim.rlim_cur);
    r.memlock_hard = limit_bytes(lim.rlim_max);
  }
  for (char** e = environ; e && *e; e++) {
    std::string kv = *e;
    if (kv.compare(0, 5, "NCCL_") != 0 && kv.compare(0, 4, "UCX_") != 0) continue;
    size_t eq = kv.find('=');
    if (eq != std::string::npos) r.nccl_env.push_back({kv.substr(0, eq), kv.substr(eq + 1)});
  }
  std::sort(r.nccl_env.begin(), r.nccl_env.end());
  return r;
}

// ---------------------------------------------------------------- decisions

namespace {

int gid_family_v4(const uint8_t* g) {
  bool mapped = true, mapped_mc = g[0] == 0xff && g[1] == 0x0e && g[2] == 0 && g[3] == 0;
  for (int i = 0; i < 10; i++) mapped = mapped && g[i] == 0;
  for (int i = 4; i < 10; i++) mapped_mc = mapped_mc && g[i] == 0;
  bool ffff = g[10] == 0xff && g[11] == 0xff;
  return (mapped || mapped_mc) && ffff;
}

// NCCL's validGid: configured (not zero, not a bare fe80:: prefix) and not link-local.
bool gid_valid(const uint8_t* g) {
  bool trailer_zero = true;
  for (int i = 4; i < 16; i++) trailer_zero = trailer_zero && g[i] == 0;
  bool head_zero = g[0] == 0 && g[1] == 0 && g[2] == 0 && g[3] == 0;
  bool fe80 = g[0] == 0xfe && g[1] == 0x80 && g[2] == 0 && g[3] == 0;
  if (trailer_zero && (head_zero || fe80)) return false;
  bool link_local = fe80 && g[4] == 0 && g[5] == 0 && g[6] == 0 && g[7] == 0;
  return !link_local;
}

int roce_version(const std::string& type) {
  if (type.compare(0, 10, "IB/RoCE v1") == 0 || type.compare(0, 7, "RoCE v1") == 0) return 1;
  if (type.compare(0, 7, "RoCE v2") == 0) return 2;
  return 0;
}

const GidEntry* find_gid(const RdmaPort& p, int index) {
  for (const GidEntry& g : p.gids)
    if (g.index == index) return &g;
  return nullptr;
}

}  // namespace

bool gid_is_ipv4_mapped(const std::string& gid) {
  uint8_t raw[16];
  return parse_gid(gid, raw) && gid_family_v4(raw);
}

std::string gid_to_text(const std::string& gid) {
  uint8_t raw[16];
  if (!parse_gid(gid, raw)) return gid;
  char buf[INET6_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET6, raw, buf, sizeof buf);
  return buf;
}

int nccl_gid_index(const RdmaPort& port) {
  if (port.gid_tbl_len <= 0) return -1;
  // the table as ibv_query_gid would return it: unlisted entries are zero
  std::vector<std::array<uint8_t, 16>> table(port.gid_tbl_len);
  std::vector<int> version(port.gid_tbl_len, 0);
  for (auto& t : table) t.fill(0);
  for (const GidEntry& g : port.gids) {
    if (g.index < 0 || g.index >= port.gid_tbl_len) continue;
    parse_gid(g.gid, table[g.index].data());
    version[g.index] = roce_version(g.type);
  }
  // ncclIbGetGidIndex / ncclUpdateGidIndex (NCCL 2.21) with NCCL_IB_ADDR_FAMILY=AF_INET,
  // NCCL_IB_ROCE_VERSION_NUM=2 and no NCCL_IB_ADDR_RANGE
  int index = 0;
  for (int c = 1; c < port.gid_tbl_len; c++) {
    const uint8_t* gid = table[index].data();
    const uint8_t* cand = table[c].data();
    bool fam_gid = gid_family_v4(gid), fam_cand = gid_family_v4(cand);
    if (fam_cand != fam_gid && fam_cand) {
      index = c;
    } else {
      if (!fam_cand || !gid_valid(cand)) continue;
      if ((version[index] != version[c] || !gid_valid(gid)) && version[c] == 2) index = c;
    }
  }
  return index;
}

std::string nccl_ib_hca_list(const std::vector<RdmaDevice>& devs, const std::string& link_layer) {
  std::string s;
  for (const RdmaDevice& d : devs)
    for (const RdmaPort& p : d.ports)
      if (p.active() && p.link_layer == link_layer)
        s += strformat("%s%s:%d", s.empty() ? "=" : ",", d.name.c_str(), p.port);
  return s;
}

std::vector<std::string> check_nccl_ib_hca(const std::string& value, const std::vector<RdmaDevice>& devs) {
  std::vector<std::string> out;
  std::string v = value;
  bool exclude = !v.empty() && v[0] == '^';
  if (exclude) v = v.substr(1);
  bool exact = !v.empty() && v[0] == '=';
  if (exact) v = v.substr(1);
  std::string names;
  for (const RdmaDevice& d : devs) names += (names.empty() ? "" : ", ") + d.name;
  if (names.empty()) names = "none";
  size_t start = 0;
  while (start <= v.size()) {
    size_t comma = v.find(',', start);
    std::string entry = trim(v.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    start = comma == std::string::npos ? v.size() + 1 : comma + 1;
    if (entry.empty()) continue;
    std::string name = entry;
    int port = -1;
    size_t colon = entry.find(':');
    if (colon != std::string::npos) name = entry.substr(0, colon), port = std::atoi(entry.c_str() + colon + 1);
    std::vector<std::string> matched;
    bool has_exact = false, port_found = port < 0;
    for (const RdmaDevice& d : devs) {
      bool m = exact ? d.name == name : d.name.compare(0, name.size(), name) == 0;
      if (!m) continue;
      matched.push_back(d.name);
      has_exact = has_exact || d.name == name;
      for (const RdmaPort& p : d.ports) port_found = port_found || p.port == port;
    }
    if (matched.empty()) {
      out.push_back(strformat("NCCL_IB_HCA=%s: \"%s\" names no RDMA device on this node (devices: %s)", value.c_str(),
                              entry.c_str(), names.c_str()));
    } else if (!exact && has_exact && matched.size() > 1) {
      std::string extra;
      for (const std::string& m : matched)
        if (m != name) extra += (extra.empty() ? "" : ", ") + m;
      out.push_back(
          strformat("NCCL_IB_HCA=%s: \"%s\" is a prefix to NCCL and also %s %s; write \"%s=%s\" to mean "
                    "exactly %s",
                    value.c_str(), name.c_str(), exclude ? "excludes" : "selects", extra.c_str(), exclude ? "^" : "",
                    v.c_str(), name.c_str()));
    } else if (!port_found) {
      out.push_back(strformat("NCCL_IB_HCA=%s: \"%s\" names port %d, which %s does not have", value.c_str(),
                              entry.c_str(), port, name.c_str()));
    }
  }
  return out;
}

std::string pci_distance(const std::string& a, int numa_a, const std::string& b, int numa_b) {
  if (a.empty() || b.empty()) return "?";
  auto split = [](const std::string& s) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (start <= s.size()) {
      size_t slash = s.find('/', start);
      if (slash == std::string::npos) slash = s.size();
      if (slash > start) parts.push_back(s.substr(start, slash - start));
      start = slash + 1;
    }
    return parts;
  };
  std::vector<std::string> pa = split(a), pb = split(b);
  size_t c = 0;
  while (c < pa.size() && c < pb.size() && pa[c] == pb[c]) c++;
  if (c == 0) return numa_a == numa_b ? "PHB" : "SYS";  // different root complexes: through the CPU(s)
  if (c == 1) return "PHB";                             // the same root complex, different root ports
  // below one root port: a PCIe switch; one switch (up to two bridge levels each side) is PIX
  return pa.size() - c <= 2 && pb.size() - c <= 2 ? "PIX" : "PXB";
}

// ---------------------------------------------------------------- JSON

namespace {

using nlohmann::json;

}  // namespace

std::string report_to_json(const RankReport& r) {
  json j;
  j["rank"] = r.rank;
  j["world"] = r.world;
  j["node"] = r.node;
  j["local_rank"] = r.local_rank;
  j["local_size"] = r.local_size;
  j["hostname"] = r.hostname;
  j["launcher"] = r.launcher;
  j["sysfs_infiniband"] = r.sysfs_infiniband;
  json devs = json::array();
  for (const RdmaDevice& d : r.rdma) {
    json jd{{"name", d.name}, {"hca_type", d.hca_type},   {"fw_ver", d.fw_ver},
            {"pci", d.pci},   {"numa_node", d.numa_node}, {"netdevs", d.netdevs}};
    json ports = json::array();
    for (const RdmaPort& p : d.ports) {
      json gids = json::array();
      for (const GidEntry& g : p.gids)
        gids.push_back({{"index", g.index}, {"gid", g.gid}, {"type", g.type}, {"ndev", g.ndev}});
      ports.push_back({{"port", p.port},
                       {"state", p.state},
                       {"phys_state", p.phys_state},
                       {"link_layer", p.link_layer},
                       {"rate", p.rate},
                       {"gid_tbl_len", p.gid_tbl_len},
                       {"gids", gids}});
    }
    jd["ports"] = ports;
    devs.push_back(jd);
  }
  j["rdma"] = devs;
  j["verbs"] = r.verbs;
  j["verbs_mismatches"] = r.verbs_mismatches;
  json ifs = json::array();
  for (const NetInterface& n : r.ifaces)
    ifs.push_back({{"name", n.name},
                   {"family", n.family},
                   {"address", n.address},
                   {"prefix_len", n.prefix_len},
                   {"up", n.up},
                   {"loopback", n.loopback}});
  j["ifaces"] = ifs;
  json gpus = json::array();
  for (const GpuPci& g : r.gpus) gpus.push_back({{"bdf", g.bdf}, {"pci", g.pci}, {"numa_node", g.numa_node}});
  j["gpus"] = gpus;
  j["cuda"] = r.cuda;
  j["cuda_built"] = r.cuda_built;
  j["nccl_version"] = r.nccl_version;
  j["nccl_path"] = r.nccl_path;
  j["peermem"] = r.peermem;
  j["memlock_soft"] = r.memlock_soft;
  j["memlock_hard"] = r.memlock_hard;
  json env = json::array();
  for (auto& kv : r.nccl_env) env.push_back({kv.first, kv.second});
  j["nccl_env"] = env;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);  // an odd byte in an env value must not throw
}

RankReport report_from_json(const std::string& text) {
  RankReport r;
  json j;
  check_json_depth(text, "a rank's netcheck report");
  try {
    j = json::parse(text);
    r.rank = j.at("rank");
    r.world = j.at("world");
    r.node = j.at("node");
    r.local_rank = j.at("local_rank");
    r.local_size = j.at("local_size");
    r.hostname = j.at("hostname");
    r.launcher = j.at("launcher");
    r.sysfs_infiniband = j.at("sysfs_infiniband");
    for (const json& jd : j.at("rdma")) {
      RdmaDevice d;
      d.name = jd.at("name");
      d.hca_type = jd.at("hca_type");
      d.fw_ver = jd.at("fw_ver");
      d.pci = jd.at("pci");
      d.numa_node = jd.at("numa_node");
      d.netdevs = jd.at("netdevs").get<std::vector<std::string>>();
      for (const json& jp : jd.at("ports")) {
        RdmaPort p;
        p.port = jp.at("port");
        p.state = jp.at("state");
        p.phys_state = jp.at("phys_state");
        p.link_layer = jp.at("link_layer");
        p.rate = jp.at("rate");
        p.gid_tbl_len = jp.at("gid_tbl_len");
        for (const json& jg : jp.at("gids"))
          p.gids.push_back({jg.at("index"), jg.at("gid"), jg.at("type"), jg.at("ndev")});
        d.ports.push_back(p);
      }
      r.rdma.push_back(d);
    }
    r.verbs = j.at("verbs");
    r.verbs_mismatches = j.at("verbs_mismatches").get<std::vector<std::string>>();
    for (const json& jn : j.at("ifaces")) {
      NetInterface n;
      n.name = jn.at("name");
      n.family = jn.at("family");
      n.address = jn.at("address");
      n.prefix_len = jn.at("prefix_len");
      n.up = jn.at("up");
      n.loopback = jn.at("loopback");
      r.ifaces.push_back(n);
    }
    for (const json& jg : j.at("gpus")) r.gpus.push_back({jg.at("bdf"), jg.at("pci"), jg.at("numa_node")});
    r.cuda = j.at("cuda").get<std::vector<std::string>>();
    r.cuda_built = j.at("cuda_built");
    r.nccl_version = j.at("nccl_version");
    r.nccl_path = j.at("nccl_path");
    r.peermem = j.at("peermem");
    r.memlock_soft = j.at("memlock_soft");
    r.memlock_hard = j.at("memlock_hard");
    for (const json& kv : j.at("nccl_env")) r.nccl_env.push_back({kv.at(0), kv.at(1)});
  } catch (const json::exception& e) {
    fail("netcheck: a rank's report is not the JSON netcheck writes (%s): %.200s", e.what(), text.c_str());
  }
  return r;
}

std::vector<std::string> gather_strings(ControlComm& comm, const std::string& mine) {
  const int n = comm.size();
  // lengths first, then every text padded to the longest (whole int32 words: the i32 type moves bytes)
  std::vector<int32_t> lens(n);
  int32_t my_len = (int32_t)mine.size();
  comm.all_gather(&my_len, lens.data(), 1, DType::i32);
  int32_t longest = *std::max_element(lens.begin(), lens.end());
  int64_t words = (longest + 3) / 4;
  std::vector<int32_t> send(std::max<int64_t>(words, 1), 0), recv(std::max<int64_t>(words, 1) * n);
  std::memcpy(send.data(), mine.data(), mine.size());
  comm.all_gather(send.data(), recv.data(), std::max<int64_t>(words, 1), DType::i32);
  std::vector<std::string> out;
  if (comm.rank() != 0) return out;
  for (int r = 0; r < n; r++)
    out.emplace_back((const char*)(recv.data() + r * std::max<int64_t>(words, 1)), (size_t)lens[r]);
  return out;
}

// ---------------------------------------------------------------- analysis

namespace {

std::string human_bytes(int64_t b) {
  if (b < 0) return "unlimited";
  if (b >= (int64_t(1) << 30)) return strformat("%.1f GiB", b / 1073741824.0);
  if (b >= (int64_t(1) << 20)) return strformat("%.0f MiB", b / 1048576.0);
  return strformat("%.0f KiB", b / 1024.0);
}

bool is_docker(const std::string& name) { return name.compare(0, 6, "docker") == 0; }
// Bridges and veths that containers and VMs add: usable, but never what reaches another node first.
bool is_virtual(const std::string& name) {
  return is_docker(name) || name.compare(0, 5, "virbr") == 0 || name.compare(0, 4, "veth") == 0 ||
         name.compare(0, 2, "br") == 0 || name.compare(0, 3, "cni") == 0 || name.compare(0, 7, "flannel") == 0;
}

bool link_local6(const NetInterface& n) { return n.family == "ipv6" && n.address.compare(0, 4, "fe80") == 0; }

// Does `addr` lie in the subnet of interface `n`?
bool in_subnet(const NetInterface& n, const NetInterface& other) {
  if (n.family != other.family || link_local6(n) || link_local6(other)) return false;
  int af = n.family == "ipv4" ? AF_INET : AF_INET6;
  uint8_t a[16] = {0}, b[16] = {0};
  if (inet_pton(af, n.address.c_str(), a) != 1 || inet_pton(af, other.address.c_str(), b) != 1) return false;
  int bits = n.prefix_len;
  if (bits <= 0) return false;  // a host route (/32 point-to-point) says nothing
  for (int i = 0; bits > 0; i++, bits -= 8) {
    uint8_t mask = bits >= 8 ? 0xff : (uint8_t)(0xff << (8 - bits));
    if ((a[i] & mask) != (b[i] & mask)) return false;
  }
  return true;
}

std::string port_key(const RdmaDevice& d, const RdmaPort& p) { return strformat("%s:%d", d.name.c_str(), p.port); }

const char* ll_short(const std::string& ll) { return ll == "InfiniBand" ? "IB" : ll == "Ethernet" ? "RoCE" : "?"; }

int version_at_least(const std::string& v, int major, int minor) {
  int a = 0, b = 0;
  if (std::sscanf(v.c_str(), "%d.%d", &a, &b) != 2) return -1;  // unknown
  return a > major || (a == major && b >= minor);
}

int level_rank(const std::string& l) {
  if (l == "PIX") return 1;
  if (l == "PXB") return 2;
  if (l == "PHB") return 3;
  if (l == "SYS") return 4;
  return 0;
}

std::string env_of(const RankReport& r, const std::string& key) {
  for (auto& kv : r.nccl_env)
    if (kv.first == key) return kv.second;
  return "";
}

// The ranks grouped by node, which every check below reads.
struct Nodes {
  std::map<int, std::vector<const RankReport*>> ranks_of;  // node -> its ranks, in rank order
  std::vector<const RankReport*> reps;                     // one report per node: its lowest rank's
};

Nodes group_by_node(const std::vector<RankReport>& ranks) {
  Nodes g;
  for (const RankReport& r : ranks) g.ranks_of[r.node].push_back(&r);
  for (auto& kv : g.ranks_of) g.reps.push_back(kv.second.front());
  return g;
}

std::string node_name(const RankReport* n) { return strformat("node %d (%s)", n->node, n->hostname.c_str()); }

bool any_gpu(const Nodes& g) {
  for (const RankReport* n : g.reps)
    if (!n->gpus.empty()) return true;
  return false;
}

void warn(Analysis& an, const std::string& w) { an.warnings.push_back(w); }
void note(Analysis& an, const std::string& w) { an.notes.push_back(w); }
void recommend(Analysis& an, const std::string& key, const std::string& value, const std::string& why,
               bool write = true) {
  an.settings.push_back({key, value, why, write});
}

// What one node has, for the report: RDMA devices with their ports and GIDs, the libibverbs
// cross-check, interfaces, GPUs, CUDA, NCCL, nvidia_peermem, the memlock limits, each GPU's nearest
// NIC. Warns of the cross-check's mismatches.
void describe_node(const RankReport* n, const std::vector<const RankReport*>& members, Analysis& an) {
  std::string& t = an.text;
  t += strformat("\n%s, ranks %d..%d\n", node_name(n).c_str(), members.front()->rank, members.back()->rank);
  if (n->rdma.empty()) {
    t += n->sysfs_infiniband ? "  RDMA: /sys/class/infiniband is empty: no RDMA device\n"
                             : "  RDMA: none (no /sys/class/infiniband: no RDMA device or driver)\n";
  }
  for (const RdmaDevice& d : n->rdma) {
    t += strformat("  %s%s%s%s%s\n", d.name.c_str(), d.hca_type.empty() ? "" : (" " + d.hca_type).c_str(),
                   d.fw_ver.empty() ? "" : (" fw " + d.fw_ver).c_str(),
                   d.netdevs.empty() ? "" : (" netdev " + d.netdevs.front()).c_str(),
                   d.numa_node < 0 ? "" : strformat(" numa %d", d.numa_node).c_str());
    for (const RdmaPort& p : d.ports) {
      t += strformat("    port %d %-6s %-10s %-11s %s\n", p.port, p.state.c_str(), p.phys_state.c_str(),
                     (p.link_layer == "Ethernet" ? "Ethernet (RoCE)" : p.link_layer).c_str(), p.rate.c_str());
      int choice = p.roce() ? nccl_gid_index(p) : -1;
      for (const GidEntry& g : p.gids)
        t += strformat("      gid %-3d %-11s %-8s %s%s\n", g.index, g.type.empty() ? "-" : g.type.c_str(),
                       g.ndev.empty() ? "-" : g.ndev.c_str(), gid_to_text(g.gid).c_str(),
                       g.index == choice ? "   <- NCCL 2.21+ picks this" : "");
    }
  }
  t += "  " + n->verbs + "\n";
  std::set<std::string> seen;  // every rank of a node usually finds the same
  for (const RankReport* m : members)
    for (const std::string& mm : m->verbs_mismatches)
      if (seen.insert(mm).second)
        warn(an, strformat("%s (rank %d): verbs: %s", node_name(n).c_str(), m->rank, mm.c_str()));
  // one line per interface, its addresses together
  std::vector<std::string> names;
  for (const NetInterface& i : n->ifaces)
    if (std::find(names.begin(), names.end(), i.name) == names.end()) names.push_back(i.name);
  if (names.empty()) t += "  interfaces: none with an address\n";
  for (const std::string& name : names) {
    std::string line = "  interface " + name;
    bool up = false;
    for (const NetInterface& i : n->ifaces)
      if (i.name == name) line += strformat(" %s/%d", i.address.c_str(), i.prefix_len), up = up || i.up;
    t += line + (up ? "" : " (down)") + "\n";
  }
  std::string gpus;
  for (const GpuPci& g : n->gpus) gpus += (gpus.empty() ? "" : ", ") + g.bdf;
  t += strformat("  GPUs on the PCI bus: %s\n", gpus.empty() ? "none" : gpus.c_str());
  if (n->cuda_built)
    for (const std::string& c : n->cuda) t += "  " + c + "\n";
  else
    t += "  CUDA: this llmt is built without CUDA\n";
  t += "  NCCL: " + n->nccl_version +
       (n->nccl_path.empty() ? std::string(" (libnccl.so.2)") : " (" + n->nccl_path + ")") + "\n";
  t += strformat("  GPUDirect RDMA module (nvidia_peermem): %s\n", n->peermem ? "loaded" : "not loaded");
  std::string ml;
  bool same = true;
  for (const RankReport* m : members) {
    ml += strformat("%s%s", ml.empty() ? "" : ", ", human_bytes(m->memlock_soft).c_str());
    same = same && m->memlock_soft == members.front()->memlock_soft;
  }
  if (same && members.size() > 1)
    ml = human_bytes(members.front()->memlock_soft) + strformat(" (all %zu ranks)", members.size());
  t += "  memlock limit per rank: " + ml + "\n";
  // GPU to nearest active NIC
  for (const GpuPci& g : n->gpus) {
    std::string best, best_dev;
    for (const RdmaDevice& d : n->rdma) {
      bool active = false;
      for (const RdmaPort& p : d.ports) active = active || p.active();
      if (!active) continue;
      std::string l = pci_distance(g.pci, g.numa_node, d.pci, d.numa_node);
      if (best.empty() || (level_rank(l) && level_rank(l) < level_rank(best))) best = l, best_dev = d.name;
    }
    if (!best.empty())
      t += strformat("  GPU %s: nearest active NIC %s (%s)\n", g.bdf.c_str(), best_dev.c_str(), best.c_str());
  }
}

// Each node against the first: active ports, the NCCL version, the number of GPUs, nvidia_peermem.
void compare_nodes(const Nodes& g, Analysis& an) {
  std::string& t = an.text;
  t += "\n";
  const int num_nodes = (int)g.reps.size();
  if (num_nodes <= 1) return;
  std::vector<std::string> diffs;
  auto active_set = [](const RankReport* n) {
    std::set<std::string> s;
    for (const RdmaDevice& d : n->rdma)
      for (const RdmaPort& p : d.ports)
        if (p.active()) s.insert(port_key(d, p) + "/" + ll_short(p.link_layer));
    return s;
  };
  const RankReport* n0 = g.reps[0];
  std::set<std::string> s0 = active_set(n0);
  for (int i = 1; i < num_nodes; i++) {
    const RankReport* n = g.reps[i];
    std::set<std::string> s = active_set(n);
    std::string only0, onlyn;
    for (const std::string& k : s0)
      if (!s.count(k)) only0 += (only0.empty() ? "" : " ") + k;
    for (const std::string& k : s)
      if (!s0.count(k)) onlyn += (onlyn.empty() ? "" : " ") + k;
    if (!only0.empty())
      diffs.push_back(
          strformat("%s lacks active %s that %s has", node_name(n).c_str(), only0.c_str(), node_name(n0).c_str()));
    if (!onlyn.empty())
      diffs.push_back(
          strformat("%s has active %s that %s lacks", node_name(n).c_str(), onlyn.c_str(), node_name(n0).c_str()));
    if (n->nccl_version != n0->nccl_version)
      diffs.push_back(strformat("NCCL %s on %s, %s on %s", n0->nccl_version.c_str(), node_name(n0).c_str(),
                                n->nccl_version.c_str(), node_name(n).c_str()));
    if (n->gpus.size() != n0->gpus.size())
      diffs.push_back(strformat("%zu GPUs on %s, %zu on %s", n0->gpus.size(), node_name(n0).c_str(), n->gpus.size(),
                                node_name(n).c_str()));
    if (n->peermem != n0->peermem)
      diffs.push_back(strformat("nvidia_peermem loaded on %s only", node_name(n->peermem ? n : n0).c_str()));
  }
  t += diffs.empty() ? "differences between nodes: none\n" : "differences between nodes:\n";
  for (const std::string& d : diffs) t += "  " + d + "\n";
  for (const std::string& d : diffs) warn(an, "nodes differ: " + d);
}

// Which RDMA ports NCCL should use: the active ports of one link layer (NCCL_IB_HCA), or none
// (NCCL_IB_DISABLE). Checks nodes without an active port and the user's NCCL_IB_HCA and
// NCCL_IB_DISABLE. Returns that link layer ("InfiniBand" or "Ethernet"), "" when no port is active.
std::string choose_rdma_ports(const Nodes& g, Analysis& an) {
  std::map<std::string, int> active_by_ll;  // link layer -> active ports over all nodes
  for (const RankReport* n : g.reps)
    for (const RdmaDevice& d : n->rdma)
      for (const RdmaPort& p : d.ports)
        if (p.active()) active_by_ll[p.link_layer]++;
  int total_active = 0;
  for (auto& kv : active_by_ll) total_active += kv.second;
  std::string ll;  // the link layer NCCL should use
  if (active_by_ll.size() > 1) {
    ll = active_by_ll["InfiniBand"] >= active_by_ll["Ethernet"] ? "InfiniBand" : "Ethernet";
    warn(an, strformat("mixed link layers: %d active InfiniBand and %d active Ethernet (RoCE) ports; NCCL cannot use "
                       "both in one job, so NCCL_IB_HCA below lists the %s ports only",
                       active_by_ll["InfiniBand"], active_by_ll["Ethernet"], ll.c_str()));
  } else if (!active_by_ll.empty()) {
    ll = active_by_ll.begin()->first;
  }
  for (const RankReport* n : g.reps) {
    bool any_port = false, any_active = false;
    for (const RdmaDevice& d : n->rdma)
      for (const RdmaPort& p : d.ports) any_port = true, any_active = any_active || p.active();
    if (any_port && !any_active)
      warn(an, strformat("%s: no active RDMA port (every port is down or initialising): check the cable and the "
                         "subnet manager (IB) or the switch port (RoCE) with `ibstat`",
                         node_name(n).c_str()));
    else if (!any_port && total_active > 0)
      warn(an, strformat("%s has no RDMA device while other nodes do: NCCL will fall back to sockets or fail on this "
                         "node",
                         node_name(n).c_str()));
  }
  const bool rdma = total_active > 0;
  if (rdma) {
    // the union over nodes: an exact name a node lacks is simply not matched there
    std::vector<std::string> keys;
    for (const RankReport* n : g.reps)
      for (const RdmaDevice& d : n->rdma)
        for (const RdmaPort& p : d.ports)
          if (p.active() && p.link_layer == ll && std::find(keys.begin(), keys.end(), port_key(d, p)) == keys.end())
            keys.push_back(port_key(d, p));
    std::string hca = "=";
    for (size_t i = 0; i < keys.size(); i++) hca += (i ? "," : "") + keys[i];
    recommend(an, "NCCL_IB_HCA", hca,
              strformat("the active %s ports, '=' for exact names (without it mlx5_1 also matches mlx5_10..19)",
                        ll == "Ethernet" ? "RoCE" : "InfiniBand"));
  } else {
    recommend(an, "NCCL_IB_DISABLE", "1", "no active RDMA port on any node: NCCL uses TCP sockets (NET/Socket)");
    bool any_dev = false;
    for (const RankReport* n : g.reps) any_dev = any_dev || !n->rdma.empty();
    if (!any_dev)
      note(an, g.reps.size() == 1
                   ? "no RDMA devices on this node: one node needs none (NCCL uses NVLink/PCIe/SHM inside a node); "
                     "across nodes NCCL would use TCP sockets"
                   : "no RDMA devices on any node: NCCL will move data between nodes over TCP sockets (NET/Socket), "
                     "typically 10x slower than RDMA for FSDP's gathers");
  }
  // the user's NCCL_IB_HCA against each node's devices
  for (const RankReport* n : g.reps) {
    std::string v = env_of(*n, "NCCL_IB_HCA");
    if (v.empty()) continue;
    for (const std::string& w : check_nccl_ib_hca(v, n->rdma)) warn(an, node_name(n) + ": " + w);
  }
  for (const RankReport* n : g.reps)
    if (rdma && env_of(*n, "NCCL_IB_DISABLE") == "1")
      warn(an, node_name(n) + ": NCCL_IB_DISABLE=1 is set although RDMA ports are active: NCCL will use sockets");
  return rdma ? ll : "";
}

// RoCE: every active port needs a RoCE v2 GID with an IPv4 address; NCCL_IB_GID_INDEX when one
// index fits every port (needed before NCCL 2.21); the user's NCCL_IB_GID_INDEX against it.
void check_roce_gid_index(const Nodes& g, Analysis& an) {
  std::map<int, std::vector<std::string>> by_index;
  for (const RankReport* n : g.reps)
    for (const RdmaDevice& d : n->rdma)
      for (const RdmaPort& p : d.ports) {
        if (!p.active() || !p.roce()) continue;
        int idx = nccl_gid_index(p);
        const GidEntry* gid = find_gid(p, idx);
        std::string where = n->hostname + " " + port_key(d, p);
        if (!gid || roce_version(gid->type) != 2 || !gid_is_ipv4_mapped(gid->gid)) {
          warn(an, strformat("%s: no RoCE v2 GID with an IPv4 address (NCCL would use index %d%s): give its net "
                             "device %s an IPv4 address, or routed RoCE will not connect",
                             where.c_str(), idx, gid ? (", " + gid->type).c_str() : "",
                             d.netdevs.empty() ? "(see device/net)" : d.netdevs.front().c_str()));
          continue;
        }
        if (!d.netdevs.empty() && !gid->ndev.empty() &&
            std::find(d.netdevs.begin(), d.netdevs.end(), gid->ndev) == d.netdevs.end())
          note(an, strformat("%s: GID %d belongs to %s, not to the port's own net device %s (a VLAN or bond?)",
                             where.c_str(), idx, gid->ndev.c_str(), d.netdevs.front().c_str()));
        by_index[idx].push_back(where);
      }
  if (by_index.size() == 1) {
    int idx = by_index.begin()->first;
    int new_nccl = 1;
    for (const RankReport* n : g.reps) new_nccl = std::min(new_nccl, version_at_least(n->nccl_version, 2, 21));
    recommend(an, "NCCL_IB_GID_INDEX", std::to_string(idx),
              new_nccl == 1 ? "the RoCE v2 IPv4 entry; NCCL 2.21+ (found here) picks it by itself: leave it unset"
                            : "the RoCE v2 IPv4 entry, as NCCL 2.21+ would pick it; older NCCL uses index 0 unless "
                              "told; leave it unset on 2.21+",
              new_nccl != 1);
  } else if (by_index.size() > 1) {
    std::string list;
    for (auto& kv : by_index)
      list += strformat("%s%d on %s", list.empty() ? "" : "; ", kv.first, kv.second.front().c_str());
    warn(an, "the RoCE v2 IPv4 GID index differs between ports (" + list +
                 "): one NCCL_IB_GID_INDEX cannot fit all; leave it unset and use NCCL 2.21+, which chooses per port");
  }
  for (const RankReport* n : g.reps) {
    std::string v = env_of(*n, "NCCL_IB_GID_INDEX");
    if (!v.empty() && by_index.size() == 1 && std::atoi(v.c_str()) != by_index.begin()->first)
      warn(an, strformat("%s: NCCL_IB_GID_INDEX=%s is set, but the RoCE v2 IPv4 entry is %d", node_name(n).c_str(),
                         v.c_str(), by_index.begin()->first));
  }
}

// NCCL_SOCKET_IFNAME: the interface NCCL's bootstrap (and, without RDMA, all its traffic) uses: on
// one node its first usable one; across nodes one whose subnet holds every other node's address.
// Warns of nodes no other node can reach and of a user's NCCL_SOCKET_IFNAME that names another.
void choose_socket_interface(const Nodes& g, bool rdma, Analysis& an) {
  const std::vector<const RankReport*>& nodes = g.reps;
  const int num_nodes = (int)nodes.size();
  std::string ifname;
  std::string ifname_why;
  auto usable = [](const NetInterface& i) { return i.up && !i.loopback && !is_docker(i.name) && !link_local6(i); };
  for (const RankReport* n : nodes) {
    bool other = false;
    for (const NetInterface& i : n->ifaces) other = other || usable(i);
    if (!other)
      warn(an, strformat("%s: only loopback or docker interfaces are up: other nodes cannot reach it (in a "
                         "container, run with --net=host)",
                         node_name(n).c_str()));
  }
  if (num_nodes == 1) {
    const RankReport* n = nodes[0];
    for (int pass = 0; pass < 2 && ifname.empty(); pass++)
      for (const NetInterface& i : n->ifaces)
        if (usable(i) && (pass == 1 || (!is_virtual(i.name) && i.family == "ipv4"))) {
          ifname = i.name;
          break;
        }
    ifname_why = "one node: its first interface that is up and neither loopback nor docker";
    if (ifname.empty()) ifname = "lo", ifname_why = "one node and no other interface: loopback serves";
  } else {
    // per node, the interfaces whose subnet holds an address of every other node
    std::vector<std::vector<std::string>> reach(num_nodes);
    for (int a = 0; a < num_nodes; a++) {
      for (const NetInterface& i : nodes[a]->ifaces) {
        if (!usable(i)) continue;
        bool all = true;
        for (int b = 0; b < num_nodes && all; b++) {
          if (b == a) continue;
          bool found = false;
          for (const NetInterface& o : nodes[b]->ifaces) found = found || (!o.loopback && in_subnet(i, o));
          all = found;
        }
        if (all && std::find(reach[a].begin(), reach[a].end(), i.name) == reach[a].end()) reach[a].push_back(i.name);
      }
      if (reach[a].empty())
        warn(an, strformat("%s: no interface shares a subnet with every other node; NCCL's bootstrap needs one: set "
                           "NCCL_SOCKET_IFNAME by hand to the interface that routes to them",
                           node_name(nodes[a]).c_str()));
    }
    // a name every node has, physical before virtual
    for (int pass = 0; pass < 2 && ifname.empty(); pass++)
      for (const std::string& name : reach[0]) {
        if (pass == 0 && is_virtual(name)) continue;
        bool everywhere = true;
        for (int b = 1; b < num_nodes; b++)
          everywhere = everywhere && std::find(reach[b].begin(), reach[b].end(), name) != reach[b].end();
        if (everywhere) {
          ifname = name;
          break;
        }
      }
    ifname_why = "the interface whose subnet holds the other nodes' addresses";
    if (ifname.empty()) {
      std::vector<std::string> names;
      for (auto& r : reach)
        if (!r.empty() && std::find(names.begin(), names.end(), r.front()) == names.end()) names.push_back(r.front());
      for (size_t i = 0; i < names.size(); i++) ifname += (i ? "," : "") + names[i];
      if (!ifname.empty()) {
        ifname_why = "the nodes reach each other through differently named interfaces; NCCL takes a list of prefixes";
        note(an, "NCCL_SOCKET_IFNAME lists several names (" + ifname + "): each node uses the one it has");
      }
    }
  }
  if (!ifname.empty()) {
    recommend(an, "NCCL_SOCKET_IFNAME", "=" + ifname,
              ifname_why + " ('=' for exact names)" + "; used for NCCL's bootstrap" +
                  (rdma ? " and out-of-band setup" : " and all its traffic"));
  }
  for (const RankReport* n : nodes) {
    std::string v = env_of(*n, "NCCL_SOCKET_IFNAME");
    if (v.empty() || ifname.empty()) continue;
    std::string bare = v;
    if (!bare.empty() && bare[0] == '^') continue;
    if (!bare.empty() && bare[0] == '=') bare = bare.substr(1);
    if (bare != ifname && ifname.compare(0, bare.size(), bare) != 0)
      warn(an, strformat("%s: NCCL_SOCKET_IFNAME=%s is set, but the interface that reaches the other nodes is %s",
                         node_name(n).c_str(), v.c_str(), ifname.c_str()));
  }
}

// GPUDirect RDMA, when RDMA ports of link layer `ll` are in use ("" none): each GPU's PCIe distance to its nearest
// such NIC sets NCCL_NET_GDR_LEVEL; warns of GPUs with no NIC on their socket and of nodes without
// nvidia_peermem.
void check_gpudirect_rdma(const Nodes& g, const std::string& ll, Analysis& an) {
  if (ll.empty()) return;
  if (!any_gpu(g)) {
    note(an, "no NVIDIA GPU on the PCI bus: NCCL_NET_GDR_LEVEL does not apply");
    return;
  }
  std::string worst;
  bool unknown = false;
  for (const RankReport* n : g.reps) {
    for (const GpuPci& gpu : n->gpus) {
      std::string best;
      for (const RdmaDevice& d : n->rdma) {
        bool usable_dev = false;
        for (const RdmaPort& p : d.ports) usable_dev = usable_dev || (p.active() && p.link_layer == ll);
        if (!usable_dev) continue;
        std::string l = pci_distance(gpu.pci, gpu.numa_node, d.pci, d.numa_node);
        if (level_rank(l) && (best.empty() || level_rank(l) < level_rank(best))) best = l;
      }
      if (best.empty()) {
        unknown = true;
        continue;
      }
      if (level_rank(best) > level_rank(worst)) worst = best;
      if (best == "SYS")
        warn(an, strformat("%s: GPU %s has no active NIC on its own CPU socket: NCCL will not use GPUDirect RDMA for "
                           "it",
                           node_name(n).c_str(), gpu.bdf.c_str()));
    }
    if (!n->peermem)
      warn(an, strformat("%s: nvidia_peermem is not loaded: GPUDirect RDMA needs it (`modprobe nvidia_peermem`) "
                         "unless NCCL can use DMA-BUF (NCCL 2.13+, kernel 5.12+, open GPU driver); the transport "
                         "report shows which (GDRDMA or not)",
                         node_name(n).c_str()));
  }
  if (unknown || worst.empty()) {
    note(an,
         "the PCIe path between GPUs and NICs is unknown (a VM?): NCCL_NET_GDR_LEVEL left to NCCL or to the "
         "provider's topology file (NCCL_TOPO_FILE)");
  } else if (level_rank(worst) <= level_rank("PXB")) {
    recommend(an, "NCCL_NET_GDR_LEVEL", "PXB",
              "every GPU has an active NIC behind the same PCIe switch: GPUDirect RDMA at NCCL's default level");
  } else if (worst == "PHB") {
    recommend(an, "NCCL_NET_GDR_LEVEL", "PHB",
              "some GPU meets its nearest NIC only at the CPU's root complex; PHB lets NCCL use GPUDirect RDMA there "
              "(check GDRDMA in the transport report, and busbw with --bench)");
  } else {
    note(an,
         "NCCL_NET_GDR_LEVEL left unset: some GPU's nearest NIC is on the other socket, where GPUDirect RDMA is "
         "slower than staging through host memory");
  }
}

// The memlock limit: RDMA registration pins memory. One line per node and limit (the ranks of a
// node usually share it): a warning when RDMA is used, a note otherwise.
void check_memlock(const Nodes& g, bool rdma, Analysis& an) {
  for (const RankReport* n : g.reps) {
    std::map<std::pair<int64_t, int64_t>, std::vector<int>> by_limit;
    for (const RankReport* m : g.ranks_of.at(n->node))
      if (m->memlock_soft >= 0) by_limit[{m->memlock_soft, m->memlock_hard}].push_back(m->rank);
    for (auto& kv : by_limit) {
      const std::vector<int>& rs = kv.second;
      std::string who = rs.size() == 1 ? strformat("rank %d", rs[0])
                                       : strformat("%zu ranks (%d..%d)", rs.size(), rs.front(), rs.back());
      std::string msg =
          strformat("%s: memlock limit %s (hard %s) for %s", node_name(n).c_str(), human_bytes(kv.first.first).c_str(),
                    human_bytes(kv.first.second).c_str(), who.c_str());
      if (rdma)
        warn(an, msg +
                     ": RDMA registration pins memory and NCCL fails with \"ibv_reg_mr failed\" past it; set memlock "
                     "unlimited (limits.conf, Slurm's PropagateResourceLimits, docker --ulimit memlock=-1)");
      else
        note(an, msg + ": too low for RDMA, which pins memory; irrelevant while no RDMA port is used");
    }
  }
}

// Nodes without libnccl.so.2 where NCCL would be needed (RDMA ports or GPUs).
void check_nccl_found(const Nodes& g, bool rdma, Analysis& an) {
  if (!rdma && !any_gpu(g)) return;
  for (const RankReport* n : g.reps)
    if (n->nccl_version == "not found")
      note(an, node_name(n) + ": libnccl.so.2 is not on the library path (the CUDA trainer will need it)");
}

// The settings, the environment rank 0 runs in, the notes and the warnings, at the report's end.
void append_summary(const std::vector<RankReport>& ranks, Analysis& an) {
  std::string& t = an.text;
  t += "recommended settings (written by --write-env):\n";
  size_t width = 0;
  for (const Setting& s : an.settings) width = std::max(width, s.key.size() + s.value.size() + 1);
  for (const Setting& s : an.settings)
    t += strformat("  %s%-*s  %s\n", s.write ? "" : "# ", (int)width, (s.key + "=" + s.value).c_str(), s.why.c_str());
  if (!ranks.front().nccl_env.empty()) {
    t += "set in the environment now (rank 0):";
    for (auto& kv : ranks.front().nccl_env) t += " " + kv.first + "=" + kv.second;
    t += "\n";
  }
  if (!an.notes.empty()) t += "notes:\n";
  for (const std::string& n : an.notes) t += "  " + n + "\n";
  t += an.warnings.empty() ? "warnings: none\n" : strformat("warnings (%zu):\n", an.warnings.size());
  for (const std::string& w : an.warnings) t += "  " + w + "\n";
}

}  // namespace

Analysis analyze(const std::vector<RankReport>& ranks) {
  Analysis an;
  LLMT_CHECK(!ranks.empty(), "netcheck: no rank reports to analyse");
  const Nodes g = group_by_node(ranks);
  const int num_nodes = (int)g.reps.size();
  an.text += strformat("llmt netcheck: %d rank%s on %d node%s (%s)\n", (int)ranks.size(), ranks.size() == 1 ? "" : "s",
                       num_nodes, num_nodes == 1 ? "" : "s", ranks[0].launcher.c_str());
  for (const RankReport* n : g.reps) describe_node(n, g.ranks_of.at(n->node), an);
  compare_nodes(g, an);
  const std::string ll = choose_rdma_ports(g, an);  // "" when no RDMA port is active
  if (ll == "Ethernet") check_roce_gid_index(g, an);
  choose_socket_interface(g, !ll.empty(), an);
  check_gpudirect_rdma(g, ll, an);
  check_memlock(g, !ll.empty(), an);
  check_nccl_found(g, !ll.empty(), an);
  append_summary(ranks, an);
  return an;
}

std::string format_env_file(const Analysis& a) {
  std::string s =
      "# written by `llmt netcheck --write-env`; scripts/launch.sh passes these to every rank (-x),\n"
      "# the sbatch scripts source them. One KEY=value a line; '#' starts a comment.\n";
  for (const Setting& x : a.settings) {
    s += "# " + x.why + "\n";
    s += (x.write ? "" : "# ") + x.key + "=" + x.value + "\n";
  }
  return s;
}

// ---------------------------------------------------------------- benchmark

const char* bench_op_name(BenchOp op) {
  switch (op) {
    case BenchOp::all_gather: return "all_gather";
    case BenchOp::reduce_scatter: return "reduce_scatter";
    case BenchOp::all_reduce: return "all_reduce";
  }
  return "?";
}

double bench_busbw_factor(BenchOp op, int n) {
  if (n <= 1) return 0.0;
  return op == BenchOp::all_reduce ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
}

int64_t bench_count(BenchOp op, int64_t bytes, int n) {
  int64_t count = bytes / (int64_t)sizeof(float);
  if (op != BenchOp::all_reduce) count = count / n * n;
  return count;
}

std::vector<BenchRow> run_collective_bench(DataComm& comm, ControlComm& control, const BenchArgs& a) {
  LLMT_CHECK(a.min_bytes >= 4 && a.max_bytes >= a.min_bytes,
             "netcheck --bench: sizes must satisfy 4 <= min_bytes <= max_bytes (got %lld, %lld)",
             (long long)a.min_bytes, (long long)a.max_bytes);
  LLMT_CHECK(a.iters > 0 && a.warmup >= 0, "netcheck --bench: --iters must be positive, --warmup not negative");
  const int n = comm.size(), me = comm.rank();
  const int64_t max_count = a.max_bytes / (int64_t)sizeof(float);
  // one allocation for the largest size: the full buffer and a 1/n slice
  std::vector<float> full((size_t)max_count), part((size_t)(max_count / n + 1));
  std::vector<BenchRow> rows;
  using clock = std::chrono::steady_clock;
  for (BenchOp op : {BenchOp::all_gather, BenchOp::reduce_scatter, BenchOp::all_reduce}) {
    for (int64_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 2) {
      const int64_t count = bench_count(op, bytes, n);
      if (count == 0) continue;
      const int64_t slice = count / n;
      auto fill = [&] {
        if (op == BenchOp::all_gather)
          for (int64_t i = 0; i < slice; i++) part[i] = (float)(me + 1 + i % 7);
        else
          for (int64_t i = 0; i < count; i++) full[i] = (float)((me + 1) * (i % 5 + 1));
      };
      auto once = [&] {
        if (op == BenchOp::all_gather)
          comm.all_gather_async(part.data(), full.data(), slice, DType::f32)->wait_host();
        else if (op == BenchOp::reduce_scatter)
          comm.reduce_scatter_async(full.data(), part.data(), slice, DType::f32, ReduceOp::sum)->wait_host();
        else
          comm.all_reduce_async(full.data(), count, DType::f32, ReduceOp::sum)->wait_host();
      };
      fill();
      for (int i = 0; i < a.warmup; i++) once();
      control.barrier();
      auto t0 = clock::now();
      for (int i = 0; i < a.iters; i++) once();
      double sec = std::chrono::duration<double>(clock::now() - t0).count() / a.iters;
      sec = control.all_reduce_sum(sec) / n;  // nccl-tests averages the ranks' times
      // one checked run on fresh inputs
      fill();
      once();
      int64_t wrong = 0;
      const double tri = n * (n + 1) / 2.0;
      if (op == BenchOp::all_gather) {
        for (int64_t i = 0; i < count; i++) wrong += full[i] != (float)(i / slice + 1 + (i % slice) % 7);
      } else if (op == BenchOp::reduce_scatter) {
        for (int64_t i = 0; i < slice; i++) wrong += part[i] != (float)(tri * ((me * slice + i) % 5 + 1));
      } else {
        for (int64_t i = 0; i < count; i++) wrong += full[i] != (float)(tri * (i % 5 + 1));
      }
      BenchRow r;
      r.op = op;
      r.count = count;
      r.bytes = count * (int64_t)sizeof(float);
      r.time_us = sec * 1e6;
      r.algbw = r.bytes / sec / 1e9;
      r.busbw = r.algbw * bench_busbw_factor(op, n);
      r.wrong = (int64_t)control.all_reduce_sum((double)wrong);
      rows.push_back(r);
    }
  }
  return rows;
}

std::string format_bench_table(const std::vector<BenchRow>& rows, int nranks) {
  std::string s = strformat(
      "# collectives over %d rank%s, float, sum; time = mean over iterations and ranks\n"
      "# algbw = size / time; busbw = algbw * (n-1)/n (all_gather, reduce_scatter), * 2(n-1)/n (all_reduce);\n"
      "# size is nccl-tests' size: all_gather's output, reduce_scatter's input, all_reduce's buffer; GB/s = 1e9 B/s\n"
      "#\n#%15s %14s %12s %6s %6s %11s %11s %11s %7s\n",
      nranks, nranks == 1 ? "" : "s", "collective", "size(B)", "count", "type", "redop", "time(us)", "algbw(GB/s)",
      "busbw(GB/s)", "#wrong");
  std::map<int, std::pair<double, int>> avg;
  for (const BenchRow& r : rows) {
    s += strformat(" %15s %14lld %12lld %6s %6s %11.2f %11.3f %11.3f %7lld\n", bench_op_name(r.op), (long long)r.bytes,
                   (long long)r.count, "float", r.op == BenchOp::all_gather ? "none" : "sum", r.time_us, r.algbw,
                   r.busbw, (long long)r.wrong);
    avg[(int)r.op].first += r.busbw;
    avg[(int)r.op].second++;
  }
  for (auto& kv : avg)
    s += strformat("# avg busbw %-15s %.3f GB/s\n", bench_op_name((BenchOp)kv.first),
                   kv.second.first / kv.second.second);
  int64_t wrong = 0;
  for (const BenchRow& r : rows) wrong += r.wrong;
  s += strformat("# out of bounds values : %lld %s\n", (long long)wrong, wrong ? "FAILED" : "OK");
  return s;
}

std::string format_bench_json(const std::vector<BenchRow>& rows, int nranks) {
  nlohmann::json j;
  j["ranks"] = nranks;
  j["type"] = "float";
  j["busbw_convention"] = "nccl-tests";
  nlohmann::json res = nlohmann::json::array();
  for (const BenchRow& r : rows)
    res.push_back({{"op", bench_op_name(r.op)},
                   {"size", r.bytes},
                   {"count", r.count},
                   {"time_us", r.time_us},
                   {"algbw_GBps", r.algbw},
                   {"busbw_GBps", r.busbw},
                   {"wrong", r.wrong}});
  j["results"] = res;
  return j.dump();
}

}  // namespace llmt
