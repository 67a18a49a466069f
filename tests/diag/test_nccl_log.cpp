// The NCCL log parser on NCCL_DEBUG=INFO lines in the formats NCCL 2.18-2.23 write them
// (src/transport/{net,p2p,shm,coll_net}.cc, net_ib.cc, net_socket.cc, init.cc; the prefix from
// debug.cc: "host:pid:tid [cudaDev] NCCL INFO ").
#include <gtest/gtest.h>

#include "engine/diag/nccl_log.h"

using namespace llmt;

namespace {

bool any_contains(const std::vector<std::string>& v, const std::string& text) {
  for (const std::string& s : v)
    if (s.find(text) != std::string::npos) return true;
  return false;
}

const NcclRankSummary* rank_of(const NcclLogSummary& s, int rank) {
  for (const NcclRankSummary& r : s.ranks)
    if (r.rank == rank) return &r;
  return nullptr;
}

}  // namespace

TEST(NcclLog, EveryConnectionKind) {
  struct Case {
    const char* line;
    NcclPath path;
    int from, to;
    const char* direction;
    bool gdr;
  } cases[] = {
      {"gpu-a:1234:1290 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", NcclPath::p2p, 0, 1, "", false},
      {"gpu-a:1234:1290 [0] NCCL INFO Channel 01/1 : 0[0] -> 1[1] via P2P/IPC/read", NcclPath::p2p, 0, 1, "", false},
      {"gpu-a:1234:1290 [0] NCCL INFO Channel 02/0 : 0[0] -> 1[1] via P2P/direct pointer/read", NcclPath::p2p, 0, 1, "",
       false},
      {"gpu-a:1234:1290 [0] NCCL INFO Channel 03/0 : 0[0] -> 3[3] via P2P/indirect/1[1]/read", NcclPath::p2p, 0, 3, "",
       false},
      {"gpu-a:1234:1290 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] via P2P/MNNVL/read", NcclPath::nvlink_multinode, 0, 4,
       "", false},
      {"gpu-a:1234:1290 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct", NcclPath::shm, 0, 1, "", false},
      {"gpu-a:1234:1290 [0] NCCL INFO Channel 01 : 1[1] -> 0[0] via SHM/CE/direct", NcclPath::shm, 1, 0, "", false},
      {"gpu-a:1234:1290 [1] NCCL INFO Channel 00/0 : 1[1] -> 8[0] [send] via NET/IB/0/GDRDMA", NcclPath::net_ib_gdr, 1,
       8, "send", true},
      {"gpu-a:1234:1290 [0] NCCL INFO Channel 00/0 : 15[7] -> 0[0] [receive] via NET/IB/0/GDRDMA/Shared",
       NcclPath::net_ib_gdr, 15, 0, "receive", true},
      {"gpu-a:1234:1290 [1] NCCL INFO Channel 02/0 : 1[1] -> 9[1] [send] via NET/IB/1(0)/GDRDMA", NcclPath::net_ib_gdr,
       1, 9, "send", true},
      {"gpu-a:1234:1290 [1] NCCL INFO Channel 00/0 : 1[1] -> 8[0] [send] via NET/IB/0", NcclPath::net_ib, 1, 8, "send",
       false},
      {"gpu-a:1234:1290 [1] NCCL INFO Channel 00/0 : 1[1] -> 8[0] [send] via NET/IBext_v8/0/GDRDMA",
       NcclPath::net_ib_gdr, 1, 8, "send", true},
      {"gpu-a:1234:1290 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0", NcclPath::net_socket, 1, 2,
       "send", false},
      {"gpu-a:1234:1290 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA",
       NcclPath::net_plugin, 0, 8, "send", true},
      {"gpu-a:1234:1290 [0] NCCL INFO CollNet 00/0 : 3 [send] via COLLNET/SHARP/0/GDRDMA", NcclPath::collnet, 3, 3,
       "send", true},
      // before 2.12 the bracket held the bus id
      {"gpu-a:1234:1290 [0] NCCL INFO Channel 00 : 0[1b000] -> 1[3d000] via P2P/IPC", NcclPath::p2p, 0, 1, "", false},
      // the message alone, as a user might paste it
      {"Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0", NcclPath::net_socket, 1, 2, "send", false},
  };
  for (const Case& c : cases) {
    NcclConnection got;
    ASSERT_TRUE(parse_nccl_connection(c.line, &got)) << c.line;
    EXPECT_EQ(got.path, c.path) << c.line;
    EXPECT_EQ(got.from, c.from) << c.line;
    EXPECT_EQ(got.to, c.to) << c.line;
    EXPECT_EQ(got.direction, c.direction) << c.line;
    EXPECT_EQ(got.gdr, c.gdr) << c.line;
  }
  NcclConnection c;
  ASSERT_TRUE(parse_nccl_connection("gpu-a:1:1 [0] NCCL INFO Channel 00/0 : 15[7] -> 0[0] [receive] via NET/IB/0", &c));
  EXPECT_EQ(c.reporter(), 0) << "a [receive] line is written by the receiver";
  EXPECT_EQ(c.net_name, "IB");
  ASSERT_TRUE(
      parse_nccl_connection("x:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0", &c));
  EXPECT_EQ(c.net_name, "AWS Libfabric");
  // lines that are not connections
  for (const char* line : {
           "gpu-a:1234:1290 [0] NCCL INFO Channel 00/02 :    0   1   2   3   4   5   6   7",
           "gpu-a:1234:1290 [0] NCCL INFO Trees [0] 1/8/-1->0->-1 [1] 1/-1/-1->0->8",
           "gpu-a:1234:1290 [0] NCCL INFO Connected all rings",
           "gpu-a:1234:1290 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via FOO/bar",
           "step 10 | loss 2.3",
       })
    EXPECT_FALSE(parse_nccl_connection(line, &c)) << line;
}

// Two nodes x 2 GPUs; rank 2 has no GPUDirect RDMA, rank 3 reached the other node only by sockets.
TEST(NcclLog, SummaryPerRankWithVerdicts) {
  std::vector<std::string> lines = {
      "gpu-a:1001:1001 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
      "gpu-a:1001:1001 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)",
      "gpu-a:1001:1001 [0] NCCL INFO cudaDriverVersion 12040",
      "NCCL version 2.21.5+cuda12.4",
      "gpu-a:1001:1001 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
      "gpu-a:1001:1040 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.1<0>",
      "gpu-a:1001:1040 [0] NCCL INFO Using non-device net plugin version 0",
      "gpu-a:1001:1040 [0] NCCL INFO Using network IB",
      "gpu-a:1001:1040 [0] NCCL INFO comm 0x55d0c8e0 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0",
      "gpu-a:1001:1040 [0] NCCL INFO Channel 00/02 :    0   1   2   3",
      "gpu-a:1001:1040 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
      "gpu-a:1001:1040 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
      "gpu-a:1001:1040 [0] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [receive] via NET/IB/0/GDRDMA",
      "gpu-a:1001:1040 [0] NCCL INFO Channel 01/0 : 3[1] -> 0[0] [receive] via NET/IB/1/GDRDMA",
      "gpu-a:1001:1040 [0] NCCL INFO Connected all rings",
      "gpu-a:1001:1040 [0] NCCL INFO comm 0x55d0c8e0 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId "
      "0x5e2b1c - Init COMPLETE",
      // a second communicator in the same process keeps the first one's rank
      "gpu-a:1001:1040 [0] NCCL INFO comm 0x55d0d000 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0",
      "gpu-a:1002:1041 [1] NCCL INFO NCCL version 2.21.5+cuda12.4",
      "gpu-a:1002:1041 [1] NCCL INFO comm 0x5600aa00 rank 1 nRanks 4 nNodes 2 localRanks 2 localRank 1 MNNVL 0",
      "gpu-a:1002:1041 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/IB/1/GDRDMA",
      "gpu-a:1002:1041 [1] NCCL INFO Channel 01/0 : 1[1] -> 2[0] [send] via NET/IB/0(0)/GDRDMA",
      "gpu-a:1002:1041 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read",
      "gpu-b:2001:2040 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
      "gpu-b:2001:2040 [0] NCCL INFO Using network IB",
      "gpu-b:2001:2040 [0] NCCL INFO comm 0x7f00 rank 2 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0",
      "gpu-b:2001:2040 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [receive] via NET/IB/0",
      "gpu-b:2001:2040 [0] NCCL INFO Channel 00 : 2[0] -> 3[1] via SHM/direct/direct",
      "",
      "gpu-b:2001:2050 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<45678> "
      "with status=12 opcode=0 len=0 vendor err 129 (Send)",
      "gpu-b:2002:2041 [1] NCCL INFO NCCL version 2.21.5+cuda12.4",
      "gpu-b:2002:2041 [1] NCCL INFO NET/IB : No device found.",
      "gpu-b:2002:2041 [1] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>",
      "gpu-b:2002:2041 [1] NCCL INFO Using network Socket",
      "gpu-b:2002:2041 [1] NCCL INFO comm 0x7f80 rank 3 nRanks 4 nNodes 2 localRanks 2 localRank 1 MNNVL 0",
      "gpu-b:2002:2041 [1] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [send] via NET/Socket/0",
      "gpu-b:2002:2041 [1] NCCL INFO Channel 01/0 : 3[1] -> 0[0] [send] via NET/Socket/0",
      "gpu-b:2002:2041 [1] NCCL INFO Channel 00 : 3[1] -> 2[0] via SHM/direct/direct",
  };
  NcclLogSummary s = parse_nccl_logs(lines);
  ASSERT_EQ(s.ranks.size(), 4u);
  EXPECT_TRUE(s.any_net);
  for (int r = 0; r < 4; r++) {
    ASSERT_TRUE(rank_of(s, r)) << r;
    EXPECT_EQ(s.ranks[r].rank, r) << "sorted by rank";
    EXPECT_EQ(rank_of(s, r)->version, "2.21.5+cuda12.4");
  }
  const NcclRankSummary& r0 = *rank_of(s, 0);
  EXPECT_EQ(r0.process, "gpu-a:1001");
  EXPECT_EQ(r0.network, "IB");
  EXPECT_EQ(r0.ib_devices, "[0]mlx5_0:1/IB [1]mlx5_1:1/IB");
  EXPECT_EQ(r0.oob, "eth0:10.0.0.1<0>");
  EXPECT_EQ(r0.nranks, 4);
  EXPECT_EQ(r0.nnodes, 2);
  EXPECT_EQ(r0.counts[(int)NcclPath::net_ib_gdr], 2);
  EXPECT_EQ(r0.counts[(int)NcclPath::p2p], 2);
  EXPECT_EQ(rank_of(s, 1)->counts[(int)NcclPath::net_ib_gdr], 2);
  EXPECT_EQ(rank_of(s, 2)->counts[(int)NcclPath::net_ib], 1);
  EXPECT_EQ(rank_of(s, 2)->counts[(int)NcclPath::shm], 1);
  ASSERT_EQ(rank_of(s, 2)->warnings.size(), 1u);
  EXPECT_NE(rank_of(s, 2)->warnings[0].find("Got completion from peer"), std::string::npos);
  const NcclRankSummary& r3 = *rank_of(s, 3);
  EXPECT_EQ(r3.network, "Socket");
  EXPECT_EQ(r3.ib_devices, "none");
  EXPECT_EQ(r3.socket_devices, "[0]eth0:10.0.0.2<0>");
  EXPECT_EQ(r3.counts[(int)NcclPath::net_socket], 2);

  EXPECT_TRUE(any_contains(s.warnings, "rank 3 (gpu-b:2002): 2 connections over NET/Socket")) << format_nccl_summary(s);
  EXPECT_TRUE(any_contains(s.warnings, "rank 2 (gpu-b:2001): 1 NET/IB connections without GPUDirect RDMA"));
  EXPECT_TRUE(any_contains(s.warnings, "rank 2 (gpu-b:2001): GPUs on this node talk through SHM"));
  EXPECT_FALSE(any_contains(s.warnings, "rank 0 ")) << "rank 0 is as it should be";
  EXPECT_FALSE(any_contains(s.warnings, "rank 1 "));

  std::string text = summarize_nccl_logs(lines);
  EXPECT_NE(text.find("rank 0 gpu-a:1001, NCCL 2.21.5+cuda12.4, network IB, 4 ranks on 2 nodes\n"
                      "  NET/IB devices: [0]mlx5_0:1/IB [1]mlx5_1:1/IB, OOB eth0:10.0.0.1<0>\n"
                      "  between nodes: NET/IB+GDRDMA x2\n"
                      "  within a node: P2P x2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  between nodes: NET/Socket x2\n"), std::string::npos) << text;
}

TEST(NcclLog, BareLinesAndNoLines) {
  // what someone pastes: messages without NCCL's prefix, credited to the rank that wrote them
  NcclLogSummary s = parse_nccl_logs({
      "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
      "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
      "Channel 00/0 : 1[0] -> 0[0] [send] via NET/IB/0/GDRDMA",
  });
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_EQ(s.ranks[0].rank, 0);
  EXPECT_EQ(s.ranks[0].counts[(int)NcclPath::net_ib_gdr], 2);
  EXPECT_EQ(s.ranks[1].counts[(int)NcclPath::net_ib_gdr], 1);
  EXPECT_TRUE(s.warnings.empty()) << format_nccl_summary(s);

  NcclLogSummary none = parse_nccl_logs({"step 1 | loss 2.0", "NCCL version 2.21.5+cuda12.4"});
  EXPECT_FALSE(none.any_net);
  EXPECT_TRUE(any_contains(none.warnings, "NCCL_DEBUG=INFO")) << format_nccl_summary(none);
}

TEST(NcclLog, DebugFileNameAsNcclExpandsIt) {
  EXPECT_EQ(expand_nccl_debug_file("/tmp/nccl.%h.%p", "gpu-a.cluster.local", 1234), "/tmp/nccl.gpu-a.1234");
  EXPECT_EQ(expand_nccl_debug_file("100%%-%x-%", "h", 1), "100%-%x-%");
}
