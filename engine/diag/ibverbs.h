// A thin layer over libibverbs, loaded with dlopen("libibverbs.so.1") at run time so that the llmt
// binary neither links nor needs it. netcheck reads sysfs for everything it decides; verbs is the
// cross-check that the devices sysfs shows can be opened and report the same port state.
#pragma once
#include <string>
#include <vector>

namespace llmt {

struct VerbsPort {
  std::string device;
  int port = 1;
  int state = 0;       // enum ibv_port_state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER
  int link_layer = 0;  // 0 unspecified, 1 InfiniBand, 2 Ethernet
  int active_mtu = 0;  // enum ibv_mtu: 1 256 .. 5 4096
  int gid_tbl_len = 0;
  std::string gid0;  // GID index 0 as sysfs writes GIDs
};

struct VerbsProbe {
  bool loaded = false;  // libibverbs.so.1 was found
  std::string error;    // why not, or a device that could not be opened
  std::vector<std::string> devices;
  std::vector<VerbsPort> ports;
};

// Lists the devices and queries ports 1..n (until a query fails) of each.
VerbsProbe probe_verbs();

const char* verbs_port_state_name(int state);  // "ACTIVE", "DOWN", ...
const char* verbs_link_layer_name(int ll);     // "InfiniBand", "Ethernet"

}  // namespace llmt
