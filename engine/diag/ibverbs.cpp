#include "engine/diag/ibverbs.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace llmt {

namespace {

// The libibverbs ABI that llmt touches, declared here so that no verbs header is needed to build.
// Opaque handles, plus the port attributes in the layout the exported ibv_query_port symbol fills
// (struct _compat_ibv_port_attr: stable since libibverbs 1.1; NCCL relies on the same).
struct ibv_device;
struct ibv_context;
struct PortAttr {
  int state, max_mtu, active_mtu, gid_tbl_len;
  uint32_t port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr;
  uint16_t pkey_tbl_len, lid, sm_lid;
  uint8_t lmc, max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width, active_speed, phys_state, link_layer,
      flags;
  uint16_t port_cap_flags2;
  uint8_t reserved[64];  // room for fields a newer library might add
};
static_assert(offsetof(PortAttr, link_layer) == 46, "ibv_port_attr layout");

struct Verbs {
  void* lib = nullptr;
  ibv_device** (*get_device_list)(int*) = nullptr;
  void (*free_device_list)(ibv_device**) = nullptr;
  const char* (*get_device_name)(ibv_device*) = nullptr;
  ibv_context* (*open_device)(ibv_device*) = nullptr;
  int (*close_device)(ibv_context*) = nullptr;
  int (*query_port)(ibv_context*, uint8_t, PortAttr*) = nullptr;
  int (*query_gid)(ibv_context*, uint8_t, int, uint8_t*) = nullptr;
};

template <class F>
bool load(void* lib, const char* name, F* f) {
  *f = reinterpret_cast<F>(dlsym(lib, name));
  return *f != nullptr;
}

std::string gid_text(const uint8_t* g) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x", g[0], g[1],
                g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]);
  return buf;
}

}  // namespace

const char* verbs_port_state_name(int state) {
  switch (state) {
    case 1: return "DOWN";
    case 2: return "INIT";
    case 3: return "ARMED";
    case 4: return "ACTIVE";
    case 5: return "ACTIVE_DEFER";
  }
  return "NOP";
}

const char* verbs_link_layer_name(int ll) {
  switch (ll) {
    case 1: return "InfiniBand";
    case 2: return "Ethernet";
  }
  return "unspecified";
}

VerbsProbe probe_verbs() {
  VerbsProbe p;
  Verbs v;
  v.lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!v.lib) {
    const char* e = dlerror();
    p.error = std::string("libibverbs.so.1 not loadable: ") + (e ? e : "?");
    return p;
  }
  bool ok = load(v.lib, "ibv_get_device_list", &v.get_device_list) &&
            load(v.lib, "ibv_free_device_list", &v.free_device_list) &&
            load(v.lib, "ibv_get_device_name", &v.get_device_name) && load(v.lib, "ibv_open_device", &v.open_device) &&
            load(v.lib, "ibv_close_device", &v.close_device) && load(v.lib, "ibv_query_port", &v.query_port) &&
            load(v.lib, "ibv_query_gid", &v.query_gid);
  if (!ok) {
    p.error = "libibverbs.so.1 lacks the ibv_* symbols llmt needs";
    return p;  // the library stays loaded: unloading verbs providers is not safe
  }
  p.loaded = true;
  int n = 0;
  ibv_device** list = v.get_device_list(&n);
  if (!list) {
    p.error = std::string("ibv_get_device_list failed: ") + std::strerror(errno);
    return p;
  }
  for (int d = 0; d < n; d++) {
    std::string name = v.get_device_name(list[d]);
    p.devices.push_back(name);
    ibv_context* ctx = v.open_device(list[d]);
    if (!ctx) {
      p.error += (p.error.empty() ? "" : "; ") + std::string("ibv_open_device(") + name +
                 ") failed: " + std::strerror(errno) + " (is /dev/infiniband present and readable?)";
      continue;
    }
    for (int port = 1; port <= 16; port++) {
      PortAttr a;
      std::memset(&a, 0, sizeof a);
      if (v.query_port(ctx, (uint8_t)port, &a) != 0) break;
      VerbsPort vp;
      vp.device = name;
      vp.port = port;
      vp.state = a.state;
      vp.link_layer = a.link_layer;
      vp.active_mtu = a.active_mtu;
      vp.gid_tbl_len = a.gid_tbl_len;
      uint8_t gid[16] = {0};
      if (a.gid_tbl_len > 0 && v.query_gid(ctx, (uint8_t)port, 0, gid) == 0) vp.gid0 = gid_text(gid);
      p.ports.push_back(vp);
    }
    v.close_device(ctx);
  }
  v.free_device_list(list);
  return p;
}

}  // namespace llmt
