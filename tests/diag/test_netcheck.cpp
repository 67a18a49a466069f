// netcheck's device, GID, interface and GPUDirect logic against fake sysfs trees built here, and
// the benchmark's nccl-tests formulas. The trees follow the kernel's layout:
//   class/infiniband/<dev>/ports/<p>/{state,phys_state,link_layer,rate,gids/<i>,gid_attrs/{types,ndevs}/<i>}
//   class/infiniband/<dev>/device -> ../../../devices/pci.../<bdf>   bus/pci/devices/<bdf> -> same
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/core/error.h"
#include "engine/diag/netcheck.h"

using namespace llmt;
namespace fs = std::filesystem;

namespace {

const char* kZeroGid = "0000:0000:0000:0000:0000:0000:0000:0000";

class FakeSysfs {
 public:
  FakeSysfs() {
    char tmpl[] = "/tmp/llmt_sysfs_XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  const std::string& root() const { return root_; }

  void put(const std::string& rel, const std::string& text) {
    fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  }
  // A device directory under devices/ and the link to it.
  void pci_device(const std::string& pci_path, const std::string& link_rel) {
    fs::create_directories(fs::path(root_) / "devices" / pci_path);
    fs::path link = fs::path(root_) / link_rel;
    fs::create_directories(link.parent_path());
    fs::create_symlink(fs::path(root_) / "devices" / pci_path, link);
  }
  void port(const std::string& dev, int p, const std::string& state, const std::string& link_layer,
            const std::string& rate = "200 Gb/sec (4X HDR)") {
    std::string d = "class/infiniband/" + dev + "/ports/" + std::to_string(p) + "/";
    put(d + "state", state == "ACTIVE" ? "4: ACTIVE" : state == "DOWN" ? "1: DOWN" : "2: INIT");
    put(d + "phys_state", state == "DOWN" ? "3: Disabled" : "5: LinkUp");
    put(d + "link_layer", link_layer);
    put(d + "rate", rate);
  }
  void gid(const std::string& dev, int p, int index, const std::string& gid, const std::string& type,
           const std::string& ndev) {
    std::string d = "class/infiniband/" + dev + "/ports/" + std::to_string(p) + "/";
    put(d + "gids/" + std::to_string(index), gid);
    if (!type.empty()) put(d + "gid_attrs/types/" + std::to_string(index), type);
    if (!ndev.empty()) put(d + "gid_attrs/ndevs/" + std::to_string(index), ndev);
  }
  // An InfiniBand HCA with one port and its link-local GID.
  void ib_hca(const std::string& dev, const std::string& state = "ACTIVE") {
    port(dev, 1, state, "InfiniBand");
    gid(dev, 1, 0, "fe80:0000:0000:0000:0c42:a103:0003:1a2b", "IB/RoCE v1", "");
    gid(dev, 1, 1, kZeroGid, "", "");  // unpopulated entries exist in a real table
  }

 private:
  std::string root_;
};

// The usual RoCE table: link-local v1/v2, IPv4-mapped v1/v2, a global IPv6 v1/v2, all on eth2.
void roce_port(FakeSysfs& s, const std::string& dev, const std::string& ndev) {
  s.port(dev, 1, "ACTIVE", "Ethernet", "100 Gb/sec (2X HDR)");
  s.put("class/infiniband/" + dev + "/device/net/" + ndev + "/ifindex", "5");
  s.gid(dev, 1, 0, "fe80:0000:0000:0000:b859:9fff:fe1a:2b3c", "IB/RoCE v1", ndev);
  s.gid(dev, 1, 1, "fe80:0000:0000:0000:b859:9fff:fe1a:2b3c", "RoCE v2", ndev);
  s.gid(dev, 1, 2, "0000:0000:0000:0000:0000:ffff:0a00:0001", "IB/RoCE v1", ndev);
  s.gid(dev, 1, 3, "0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2", ndev);
  s.gid(dev, 1, 4, "fd00:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1", ndev);
  s.gid(dev, 1, 5, "fd00:0000:0000:0000:0000:0000:0000:0001", "RoCE v2", ndev);
  s.gid(dev, 1, 6, kZeroGid, "", "");
}

const Setting* find_setting(const Analysis& a, const std::string& key) {
  for (const Setting& s : a.settings)
    if (s.key == key) return &s;
  return nullptr;
}

bool any_contains(const std::vector<std::string>& v, const std::string& text) {
  for (const std::string& s : v)
    if (s.find(text) != std::string::npos) return true;
  return false;
}

RankReport node_report(const FakeSysfs& s, int node, const std::string& host) {
  RankReport r;
  r.rank = node;
  r.world = 2;
  r.node = node;
  r.hostname = host;
  r.launcher = "mpirun";
  r.rdma = read_rdma_devices(s.root());
  r.sysfs_infiniband = true;
  r.gpus = read_nvidia_gpus(s.root());
  r.peermem = read_peermem_loaded(s.root());
  r.nccl_version = "2.21.5";
  r.memlock_soft = r.memlock_hard = -1;
  return r;
}

NetInterface iface(const std::string& name, const std::string& addr, int prefix, bool loopback = false) {
  NetInterface n;
  n.name = name;
  n.family = addr.find(':') == std::string::npos ? "ipv4" : "ipv6";
  n.address = addr;
  n.prefix_len = prefix;
  n.up = true;
  n.loopback = loopback;
  return n;
}

}  // namespace

TEST(Netcheck, InfiniBandPort) {
  FakeSysfs s;
  s.ib_hca("mlx5_0");
  s.put("class/infiniband/mlx5_0/hca_type", "MT4123");
  s.put("class/infiniband/mlx5_0/fw_ver", "20.31.1014");
  auto devs = read_rdma_devices(s.root());
  ASSERT_EQ(devs.size(), 1u);
  EXPECT_EQ(devs[0].name, "mlx5_0");
  EXPECT_EQ(devs[0].hca_type, "MT4123");
  ASSERT_EQ(devs[0].ports.size(), 1u);
  const RdmaPort& p = devs[0].ports[0];
  EXPECT_EQ(p.state, "ACTIVE");
  EXPECT_TRUE(p.active());
  EXPECT_EQ(p.phys_state, "LinkUp");
  EXPECT_EQ(p.link_layer, "InfiniBand");
  EXPECT_FALSE(p.roce());
  EXPECT_EQ(p.rate, "200 Gb/sec (4X HDR)");
  EXPECT_EQ(p.gid_tbl_len, 2);
  ASSERT_EQ(p.gids.size(), 1u);  // the zero entry is dropped
  EXPECT_EQ(p.gids[0].type, "IB/RoCE v1");
  EXPECT_EQ(gid_to_text(p.gids[0].gid), "fe80::c42:a103:3:1a2b");
  EXPECT_EQ(nccl_ib_hca_list(devs, "InfiniBand"), "=mlx5_0:1");

  RankReport r = node_report(s, 0, "a");
  r.world = 1;
  Analysis a = analyze({r});
  ASSERT_TRUE(find_setting(a, "NCCL_IB_HCA"));
  EXPECT_EQ(find_setting(a, "NCCL_IB_HCA")->value, "=mlx5_0:1");
  EXPECT_FALSE(find_setting(a, "NCCL_IB_GID_INDEX")) << "InfiniBand needs no GID index";
  EXPECT_FALSE(find_setting(a, "NCCL_IB_DISABLE"));
  EXPECT_NE(format_env_file(a).find("\nNCCL_IB_HCA==mlx5_0:1\n"), std::string::npos) << format_env_file(a);
}

TEST(Netcheck, RoceGidChoiceFollowsNccl) {
  FakeSysfs s;
  roce_port(s, "mlx5_0", "eth2");
  auto devs = read_rdma_devices(s.root());
  ASSERT_EQ(devs.size(), 1u);
  const RdmaPort& p = devs[0].ports[0];
  EXPECT_TRUE(p.roce());
  EXPECT_EQ(devs[0].netdevs, std::vector<std::string>{"eth2"});
  ASSERT_EQ(p.gids.size(), 6u);
  EXPECT_EQ(p.gids[3].type, "RoCE v2");
  EXPECT_EQ(p.gids[3].ndev, "eth2");
  EXPECT_TRUE(gid_is_ipv4_mapped(p.gids[3].gid));
  EXPECT_FALSE(gid_is_ipv4_mapped(p.gids[5].gid));
  EXPECT_EQ(gid_to_text(p.gids[3].gid), "::ffff:10.0.0.1");
  EXPECT_EQ(nccl_gid_index(p), 3) << "RoCE v2 + IPv4-mapped";
  EXPECT_EQ(nccl_ib_hca_list(devs, "Ethernet"), "=mlx5_0:1");

  // v2 before v1 in the table: still the v2 IPv4 entry
  RdmaPort q = p;
  q.gids[2].type = "RoCE v2";
  q.gids[3].type = "IB/RoCE v1";
  EXPECT_EQ(nccl_gid_index(q), 2);
  // only IPv4 v1: NCCL takes it (the family matters first), and netcheck warns
  RdmaPort v1only = p;
  v1only.gids.erase(v1only.gids.begin() + 3);
  EXPECT_EQ(nccl_gid_index(v1only), 2);
  // no IPv4 address at all: NCCL stays on index 0
  RdmaPort v6only = p;
  v6only.gids.erase(v6only.gids.begin() + 2, v6only.gids.begin() + 4);
  EXPECT_EQ(nccl_gid_index(v6only), 0);
  RdmaPort empty;
  EXPECT_EQ(nccl_gid_index(empty), -1);

  RankReport r = node_report(s, 0, "a");
  r.world = 1;
  Analysis a = analyze({r});
  const Setting* gid = find_setting(a, "NCCL_IB_GID_INDEX");
  ASSERT_TRUE(gid) << a.text;
  EXPECT_EQ(gid->value, "3");
  EXPECT_FALSE(gid->write) << "NCCL 2.21 picks it itself: written commented out";
  EXPECT_NE(format_env_file(a).find("# NCCL_IB_GID_INDEX=3\n"), std::string::npos) << format_env_file(a);
  EXPECT_NE(a.text.find("gid 3   RoCE v2     eth2     ::ffff:10.0.0.1   <- NCCL 2.21+ picks this"), std::string::npos)
      << a.text;
  r.nccl_version = "2.18.3";
  EXPECT_TRUE(find_setting(analyze({r}), "NCCL_IB_GID_INDEX")->write) << "older NCCL needs it set";

  // a RoCE port whose netdev has no IPv4 address
  RankReport bad = r;
  bad.rdma[0].ports[0] = v6only;
  Analysis b = analyze({bad});
  EXPECT_TRUE(any_contains(b.warnings, "no RoCE v2 GID with an IPv4 address")) << b.text;
  EXPECT_FALSE(find_setting(b, "NCCL_IB_GID_INDEX"));
}

TEST(Netcheck, DownPortAndNoDevices) {
  FakeSysfs s;
  s.ib_hca("mlx5_0", "DOWN");
  auto devs = read_rdma_devices(s.root());
  ASSERT_EQ(devs.size(), 1u);
  EXPECT_FALSE(devs[0].ports[0].active());
  EXPECT_EQ(devs[0].ports[0].phys_state, "Disabled");
  EXPECT_EQ(nccl_ib_hca_list(devs, "InfiniBand"), "");
  RankReport r = node_report(s, 0, "a");
  r.world = 1;
  Analysis a = analyze({r});
  EXPECT_TRUE(any_contains(a.warnings, "no active RDMA port")) << a.text;
  ASSERT_TRUE(find_setting(a, "NCCL_IB_DISABLE"));
  EXPECT_EQ(find_setting(a, "NCCL_IB_DISABLE")->value, "1");
  EXPECT_FALSE(find_setting(a, "NCCL_IB_HCA"));

  FakeSysfs none;
  EXPECT_TRUE(read_rdma_devices(none.root()).empty());
  RankReport n = node_report(none, 0, "a");
  n.world = 1;
  n.sysfs_infiniband = false;
  n.ifaces = {iface("lo", "127.0.0.1", 8, true), iface("eth0", "192.0.2.2", 24)};
  Analysis b = analyze({n});
  EXPECT_EQ(find_setting(b, "NCCL_IB_DISABLE")->value, "1");
  EXPECT_EQ(find_setting(b, "NCCL_SOCKET_IFNAME")->value, "=eth0");
  EXPECT_NE(b.text.find("RDMA: none"), std::string::npos) << b.text;
  EXPECT_TRUE(any_contains(b.notes, "no RDMA devices on this node")) << b.text;
  EXPECT_TRUE(b.warnings.empty()) << b.text;
}

TEST(Netcheck, TwoHcasAndMixedLinkLayers) {
  FakeSysfs s;
  s.ib_hca("mlx5_0");
  s.ib_hca("mlx5_1");
  s.ib_hca("mlx5_2", "DOWN");
  auto devs = read_rdma_devices(s.root());
  ASSERT_EQ(devs.size(), 3u);
  EXPECT_EQ(nccl_ib_hca_list(devs, "InfiniBand"), "=mlx5_0:1,mlx5_1:1");
  RankReport r = node_report(s, 0, "a");
  r.world = 1;
  EXPECT_EQ(find_setting(analyze({r}), "NCCL_IB_HCA")->value, "=mlx5_0:1,mlx5_1:1");

  // one more HCA, RoCE: NCCL cannot mix them; the InfiniBand majority is kept
  roce_port(s, "mlx5_3", "eth3");
  RankReport m = node_report(s, 0, "a");
  m.world = 1;
  Analysis a = analyze({m});
  EXPECT_TRUE(any_contains(a.warnings, "mixed link layers")) << a.text;
  EXPECT_EQ(find_setting(a, "NCCL_IB_HCA")->value, "=mlx5_0:1,mlx5_1:1");
}

TEST(Netcheck, PrefixMatchWarnings) {
  FakeSysfs s;
  for (const char* d : {"mlx5_1", "mlx5_10", "mlx5_11", "mlx5_2"}) s.ib_hca(d);
  auto devs = read_rdma_devices(s.root());
  ASSERT_EQ(devs.size(), 4u);
  // natural order, as ibv_devices and NCCL's own listing show them
  EXPECT_EQ(devs[0].name, "mlx5_1");
  EXPECT_EQ(devs[1].name, "mlx5_2");
  EXPECT_EQ(devs[2].name, "mlx5_10");
  EXPECT_EQ(nccl_ib_hca_list(devs, "InfiniBand"), "=mlx5_1:1,mlx5_2:1,mlx5_10:1,mlx5_11:1");

  auto w = check_nccl_ib_hca("mlx5_1:1", devs);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("also selects mlx5_10, mlx5_11"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("\"=mlx5_1:1\""), std::string::npos) << w[0];
  w = check_nccl_ib_hca("^mlx5_1", devs);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("also excludes mlx5_10, mlx5_11"), std::string::npos) << w[0];
  EXPECT_TRUE(check_nccl_ib_hca("=mlx5_1:1,mlx5_2:1", devs).empty());
  EXPECT_TRUE(check_nccl_ib_hca("mlx5", devs).empty()) << "a prefix on purpose";
  EXPECT_TRUE(check_nccl_ib_hca("mlx5_2", devs).empty()) << "nothing else starts with mlx5_2";
  w = check_nccl_ib_hca("=mlx5_0", devs);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("names no RDMA device"), std::string::npos) << w[0];
  w = check_nccl_ib_hca("=mlx5_1:2", devs);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("port 2"), std::string::npos) << w[0];

  // from the environment, in the report
  RankReport r = node_report(s, 0, "a");
  r.world = 1;
  r.nccl_env = {{"NCCL_IB_HCA", "mlx5_1"}};
  Analysis a = analyze({r});
  EXPECT_TRUE(any_contains(a.warnings, "also selects mlx5_10")) << a.text;
}

TEST(Netcheck, GpuDirectLevelFromPciPaths) {
  FakeSysfs s;
  // one PCIe switch below root port 0000:17:01.0: the GPU and mlx5_0 on two of its downstream ports;
  // mlx5_1 on another root complex of the other socket
  const std::string sw = "pci0000:17/0000:17:01.0/0000:18:00.0";
  s.pci_device(sw + "/0000:19:00.0/0000:1a:00.0", "bus/pci/devices/0000:1a:00.0");
  s.put("bus/pci/devices/0000:1a:00.0/vendor", "0x10de");
  s.put("bus/pci/devices/0000:1a:00.0/class", "0x030200");
  s.put("bus/pci/devices/0000:1a:00.0/numa_node", "0");
  s.pci_device(sw + "/0000:19:01.0/0000:1b:00.0", "class/infiniband/mlx5_0/device");
  s.put("class/infiniband/mlx5_0/device/numa_node", "0");
  s.ib_hca("mlx5_0");
  s.pci_device("pci0000:a0/0000:a0:01.0/0000:a1:00.0", "class/infiniband/mlx5_1/device");
  s.put("class/infiniband/mlx5_1/device/numa_node", "1");
  s.ib_hca("mlx5_1");
  // not a GPU: an Intel NIC on the bus
  s.pci_device("pci0000:00/0000:00:03.0", "bus/pci/devices/0000:00:03.0");
  s.put("bus/pci/devices/0000:00:03.0/vendor", "0x8086");

  auto gpus = read_nvidia_gpus(s.root());
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].bdf, "0000:1a:00.0");
  EXPECT_EQ(gpus[0].pci, sw + "/0000:19:00.0/0000:1a:00.0");
  auto devs = read_rdma_devices(s.root());
  ASSERT_EQ(devs.size(), 2u);
  EXPECT_EQ(devs[0].pci, sw + "/0000:19:01.0/0000:1b:00.0");
  EXPECT_EQ(devs[1].numa_node, 1);
  EXPECT_EQ(pci_distance(gpus[0].pci, 0, devs[0].pci, 0), "PIX");
  EXPECT_EQ(pci_distance(gpus[0].pci, 0, devs[1].pci, 1), "SYS");
  EXPECT_EQ(pci_distance("pci0000:17/0000:17:01.0/a", 0, "pci0000:17/0000:17:02.0/b", 0), "PHB");
  EXPECT_EQ(pci_distance("pci0000:17/0000:17:01.0/a", 0, "pci0000:3a/0000:3a:01.0/b", 0), "PHB");
  EXPECT_EQ(pci_distance("pci0000:17/r/u/d1/x/y/gpu", 0, "pci0000:17/r/u/d2/nic", 0), "PXB");
  EXPECT_EQ(pci_distance("", 0, "pci0000:17", 0), "?");

  RankReport r = node_report(s, 0, "a");
  r.world = 1;
  EXPECT_FALSE(r.peermem);
  Analysis a = analyze({r});
  ASSERT_TRUE(find_setting(a, "NCCL_NET_GDR_LEVEL")) << a.text;
  EXPECT_EQ(find_setting(a, "NCCL_NET_GDR_LEVEL")->value, "PXB");
  EXPECT_TRUE(any_contains(a.warnings, "nvidia_peermem is not loaded")) << a.text;
  EXPECT_NE(a.text.find("GPU 0000:1a:00.0: nearest active NIC mlx5_0 (PIX)"), std::string::npos) << a.text;

  s.put("module/nvidia_peermem/refcnt", "0");
  r = node_report(s, 0, "a");
  r.world = 1;
  EXPECT_TRUE(r.peermem);
  EXPECT_FALSE(any_contains(analyze({r}).warnings, "nvidia_peermem")) << analyze({r}).text;
}

TEST(Netcheck, TwoNodesInterfacesAndDifferences) {
  FakeSysfs s0, s1;
  s0.ib_hca("mlx5_0");
  s0.ib_hca("mlx5_1");
  s1.ib_hca("mlx5_0");
  s1.ib_hca("mlx5_1", "DOWN");
  RankReport a = node_report(s0, 0, "gpu-a"), b = node_report(s1, 1, "gpu-b");
  b.rank = 1;
  // docker0 has the same subnet on both (and must not be chosen); ens1 only reaches the outside
  a.ifaces = {iface("lo", "127.0.0.1", 8, true), iface("docker0", "172.17.0.1", 16), iface("ens1", "192.168.7.5", 24),
              iface("ib0", "10.10.0.1", 16), iface("ib0", "fe80::1", 64)};
  b.ifaces = {iface("lo", "127.0.0.1", 8, true), iface("docker0", "172.17.0.1", 16), iface("ens1", "192.168.9.8", 24),
              iface("ib0", "10.10.0.2", 16), iface("ib0", "fe80::2", 64)};
  a.memlock_soft = a.memlock_hard = 64 << 10;
  Analysis an = analyze({a, b});
  ASSERT_TRUE(find_setting(an, "NCCL_SOCKET_IFNAME")) << an.text;
  EXPECT_EQ(find_setting(an, "NCCL_SOCKET_IFNAME")->value, "=ib0");
  EXPECT_EQ(find_setting(an, "NCCL_IB_HCA")->value, "=mlx5_0:1,mlx5_1:1");
  EXPECT_TRUE(any_contains(an.warnings, "node 1 (gpu-b) lacks active mlx5_1:1/IB that node 0 (gpu-a) has")) << an.text;
  EXPECT_TRUE(any_contains(an.warnings, "memlock limit 64 KiB")) << an.text;
  EXPECT_NE(an.text.find("differences between nodes:"), std::string::npos);

  // only loopback and docker on one node
  b.ifaces = {iface("lo", "127.0.0.1", 8, true), iface("docker0", "172.17.0.1", 16)};
  Analysis c = analyze({a, b});
  EXPECT_TRUE(any_contains(c.warnings, "node 1 (gpu-b): only loopback or docker interfaces")) << c.text;
  EXPECT_TRUE(any_contains(c.warnings, "no interface shares a subnet")) << c.text;

  // a user's NCCL_SOCKET_IFNAME that is not the one that reaches the other node
  b.ifaces = a.ifaces;
  b.ifaces[2].address = "192.168.9.8";
  b.ifaces[3].address = "10.10.0.2";
  a.nccl_env = {{"NCCL_SOCKET_IFNAME", "ens1"}};
  Analysis d = analyze({a, b});
  EXPECT_TRUE(any_contains(d.warnings, "NCCL_SOCKET_IFNAME=ens1 is set")) << d.text;
}

TEST(Netcheck, ReportJsonRoundTrip) {
  FakeSysfs s;
  roce_port(s, "mlx5_0", "eth2");
  RankReport r = node_report(s, 0, "host-a");
  r.ifaces = {iface("eth0", "10.0.0.1", 24)};
  r.gpus = {{"0000:1a:00.0", "pci0000:17/0000:1a:00.0", 0}};
  r.cuda = {"cuda:0 NVIDIA H200"};
  r.memlock_soft = 8 << 20;
  r.nccl_env = {{"NCCL_DEBUG", "INFO"}};
  RankReport back = report_from_json(report_to_json(r));
  EXPECT_EQ(report_to_json(back), report_to_json(r));
  EXPECT_EQ(back.rdma[0].ports[0].gids[3].type, "RoCE v2");
  EXPECT_EQ(back.memlock_soft, 8 << 20);
  EXPECT_THROW(report_from_json("{\"rank\": 0}"), Error);
}

TEST(Netcheck, BenchFormulasFollowNcclTests) {
  EXPECT_DOUBLE_EQ(bench_busbw_factor(BenchOp::all_reduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bench_busbw_factor(BenchOp::all_gather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bench_busbw_factor(BenchOp::reduce_scatter, 2), 0.5);
  EXPECT_DOUBLE_EQ(bench_busbw_factor(BenchOp::all_reduce, 1), 0.0);
  EXPECT_EQ(bench_count(BenchOp::all_reduce, 1024, 3), 256);
  EXPECT_EQ(bench_count(BenchOp::all_gather, 1024, 3), 255) << "rounded to a multiple of the ranks";
  EXPECT_EQ(bench_count(BenchOp::reduce_scatter, 8, 3), 0);
  BenchRow r;
  r.op = BenchOp::all_reduce;
  r.bytes = 1 << 20;
  r.count = 1 << 18;
  r.time_us = 100;
  r.algbw = r.bytes / 100e-6 / 1e9;
  r.busbw = r.algbw * bench_busbw_factor(r.op, 4);
  std::string t = format_bench_table({r}, 4);
  EXPECT_NE(t.find("all_reduce        1048576       262144  float    sum      100.00      10.486      15.729"),
            std::string::npos)
      << t;
  EXPECT_NE(format_bench_json({r}, 4).find("\"op\":\"all_reduce\""), std::string::npos);
}
