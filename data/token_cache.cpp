#include "data/token_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "data/tokenizer.h"
#include "engine/core/crc32c.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/core/stop.h"

namespace llmt {

// ---- key hashing ----

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t fmix64(uint64_t k) {  // MurmurHash3's finaliser: every input bit reaches every output bit
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

// Two 64-bit lanes over 8-byte words, seeded with the length (which makes every add length-prefixed).
static void hash_bytes(const uint8_t* p, size_t n, uint64_t* out_a, uint64_t* out_b) {
  const uint64_t k1 = 0x87c37b91114253d5ull, k2 = 0x4cf5ad432745937full;
  uint64_t a = 0x9e3779b97f4a7c15ull ^ (uint64_t)n, b = 0xc2b2ae3d27d4eb4full + (uint64_t)n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    a = rotl64(a ^ (w * k1), 31) * k2;
    b = rotl64(b + (w * k2), 27) * k1 + 0x52dce729;
  }
  uint64_t w = 0;
  std::memcpy(&w, p + i, n - i);
  a = fmix64(a ^ (w * k1) ^ rotl64(b, 13));
  b = fmix64(b + (w * k2) + a);
  *out_a = a;
  *out_b = b;
}

void KeyHasher::fold(uint64_t a, uint64_t b) {
  h0_ = fmix64(h0_ ^ a) + 0x9e3779b97f4a7c15ull;
  h1_ = fmix64(h1_ ^ b ^ rotl64(h0_, 17));
}

KeyHasher& KeyHasher::add(std::string_view s) {
  uint64_t a, b;
  hash_bytes((const uint8_t*)s.data(), s.size(), &a, &b);
  fold(a, b);
  return *this;
}

KeyHasher& KeyHasher::add_int(int64_t v) {
  char buf[8];
  std::memcpy(buf, &v, 8);
  return add(std::string_view(buf, 8));
}

KeyHasher& KeyHasher::add_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  LLMT_CHECK(f, "cannot open %s to hash it for the token cache: %s", path.c_str(), std::strerror(errno));
  struct stat st;
  if (::fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {  // /dev/zero never ends
    std::fclose(f);
    fail("%s is not a regular file: the token cache hashes only files of a known size", path.c_str());
  }
  std::vector<uint8_t> buf(1 << 20);
  int64_t total = 0;
  for (;;) {
    size_t got = std::fread(buf.data(), 1, buf.size(), f);
    if (got > 0) {
      uint64_t a, b;
      hash_bytes(buf.data(), got, &a, &b);
      fold(a, b);
      total += (int64_t)got;
    }
    if (got < buf.size()) break;
    if (stop_now()) {  // a SIGTERM while hashing a large file: stop now, not after it
      std::fclose(f);
      throw_if_stopped("hashing " + path + " for the token cache");
    }
  }
  bool bad = std::ferror(f) != 0;
  std::fclose(f);
  LLMT_CHECK(!bad, "read error in %s while hashing it for the token cache", path.c_str());
  return add_int(total);
}

std::string KeyHasher::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)h0_, (unsigned long long)h1_);
  return buf;
}

static bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
static bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void add_tokenizer_to_key(KeyHasher& h, const Tokenizer& tok, const std::string& path) {
  h.add("tokenizer").add(tok.kind()).add_int(tok.vocab_size()).add_int(tok.bos_id()).add_int(tok.eos_id());
  h.add_int(tok.adds_bos()).add_int(tok.adds_eos());
  if (path.empty()) {
    // No files to hash: what the tokenizer does stands in for them (costs a decode per id).
    for (int i = 0; i < tok.vocab_size(); i++) h.add(tok.decode({i}));
    const char* probe = "Hello world! The quick brown fox jumps over the lazy dog.\n\tÜber 1234 naïve café, "
                        "日本語のテキスト, emoji 🙂, code: int main() { return 0; }  <|endoftext|></s><s>";
    for (int32_t id : tok.encode(probe)) h.add_int(id);
    return;
  }
  if (!is_dir(path)) {
    LLMT_CHECK(is_file(path), "tokenizer path %s is neither a file nor a directory", path.c_str());
    h.add_file(path);
    return;
  }
  static const char* names[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model"};
  for (const char* n : names) {
    std::string p = path + "/" + n;
    if (is_file(p)) h.add(n).add_file(p);
  }
  // tiktoken rank files have no fixed name; hash them in name order
  std::vector<std::string> tk;
  if (DIR* d = ::opendir(path.c_str())) {
    while (struct dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 9 && n.compare(n.size() - 9, 9, ".tiktoken") == 0) tk.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(tk.begin(), tk.end());
  for (const std::string& n : tk) h.add(n).add_file(path + "/" + n);
}

// --cache_dir, else $LLMT_CACHE, else $XDG_CACHE_HOME/llmt, else ~/.cache/llmt; "none" turns the cache off.
std::string resolve_cache_dir(const std::string& flag) {
  if (flag == "none") return std::string();
  if (!flag.empty()) return flag;
  const char* env = std::getenv("LLMT_CACHE");
  if (env && *env) return std::string(env) == "none" ? std::string() : std::string(env);
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/llmt";
  const char* home = std::getenv("HOME");
  return home && *home ? std::string(home) + "/.cache/llmt" : std::string();
}

// ---- the file ----

namespace {

constexpr char kMagic[8] = {'L', 'L', 'M', 'T', 'T', 'O', 'K', '1'};
constexpr uint32_t kVersion = 2;  // 2: the CRC-32C of the body in the header
constexpr uint32_t kLabelsAreIds = 1;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t flags;
  int64_t n_examples;
  int64_t n_tokens;
  int64_t stats[4];
  char key[56];
  uint32_t body_crc32c;  // CRC-32C of everything after the header (offsets, ids, labels)
  uint32_t reserved;
};
static_assert(sizeof(Header) == 128, "token cache header is 128 bytes");

int64_t file_bytes(const Header& h) {
  const int64_t label_sets = (h.flags & kLabelsAreIds) ? 1 : 2;
  return (int64_t)sizeof(Header) + 8 * (h.n_examples + 1) + 4 * h.n_tokens * label_sets;
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "host";
  return buf;
}

std::string unique_suffix() {
  static std::atomic<int> counter{0};
  return host_name() + "." + std::to_string((long)::getpid()) + "." + std::to_string(counter++);
}

void make_dirs(const std::string& dir) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      fail("cannot create token cache directory %s: %s", cur.c_str(), std::strerror(errno));
  }
  LLMT_CHECK(is_dir(dir), "token cache path %s is not a directory", dir.c_str());
}

}  // namespace

std::string token_cache_path(const std::string& dir, const std::string& name, const std::string& key) {
  return dir + "/" + name + "-" + key + ".tokens";
}

void write_token_cache(const std::string& path, const std::string& key, const TokenDataset& ds, const CacheStats& st) {
  LLMT_CHECK(key.size() < sizeof(Header::key), "token cache key %s is too long", key.c_str());
  Header h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.flags = ds.labels_are_ids() ? kLabelsAreIds : 0;
  h.n_examples = ds.size();
  h.n_tokens = ds.total_tokens();
  for (int i = 0; i < 4; i++) h.stats[i] = st.v[i];
  std::memcpy(h.key, key.data(), key.size());
  static const int64_t zero = 0;
  const size_t nt = (size_t)h.n_tokens;
  if (ds.size() > 0) {
    h.body_crc32c = crc32c(0, ds.offsets_data(), 8 * ((size_t)ds.size() + 1));
    h.body_crc32c = crc32c(h.body_crc32c, ds.ids_data(), 4 * nt);
    if (!ds.labels_are_ids()) h.body_crc32c = crc32c(h.body_crc32c, ds.labels_data(), 4 * nt);
  } else {
    h.body_crc32c = crc32c(0, &zero, 8);
  }

  const std::string tmp = path + ".tmp." + unique_suffix();
  FILE* f = std::fopen(tmp.c_str(), "wb");
  LLMT_CHECK(f, "cannot create %s: %s", tmp.c_str(), std::strerror(errno));
  bool ok = std::fwrite(&h, sizeof h, 1, f) == 1;
  if (ds.size() > 0) {
    ok = ok && std::fwrite(ds.offsets_data(), 8, (size_t)ds.size() + 1, f) == (size_t)ds.size() + 1;
    ok = ok && std::fwrite(ds.ids_data(), 4, nt, f) == nt;
    if (!ds.labels_are_ids()) ok = ok && std::fwrite(ds.labels_data(), 4, nt, f) == nt;
  } else {
    ok = ok && std::fwrite(&zero, 8, 1, f) == 1;  // offsets[0]
  }
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    ::unlink(tmp.c_str());
    fail("cannot write token cache %s: %s", tmp.c_str(), std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail("cannot rename %s to %s: %s", tmp.c_str(), path.c_str(), std::strerror(e));
  }
}

// The first id (or label other than -100) outside [0, vocab_size), as a reason; "" when none.
static std::string first_out_of_vocab(const int64_t* off, int64_t n_examples, const int32_t* ids,
                                      const int32_t* labels, int64_t vocab_size) {
  for (int64_t e = 0; e < n_examples; e++)
    for (int64_t i = off[e]; i < off[e + 1]; i++) {
      const bool id_bad = ids[i] < 0 || ids[i] >= vocab_size;
      if (id_bad || (labels[i] != kIgnoreIndex && (labels[i] < 0 || labels[i] >= vocab_size)))
        return strformat("%s %d of example %lld, position %lld, is outside the tokenizer's vocabulary [0, %lld)",
                         id_bad ? "token id" : "label", id_bad ? ids[i] : labels[i], (long long)e,
                         (long long)(i - off[e]), (long long)vocab_size);
    }
  return "";
}

bool map_token_cache(const std::string& path, const std::string& key, TokenDataset* ds, CacheStats* st,
                     int64_t vocab_size) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    LLMT_CHECK(errno == ENOENT, "cannot open token cache %s: %s", path.c_str(), std::strerror(errno));
    return false;
  }
  struct stat sb;
  const bool st_ok = ::fstat(fd, &sb) == 0;
  const int64_t size = st_ok ? (int64_t)sb.st_size : 0;
  void* base = size >= (int64_t)sizeof(Header) ? ::mmap(nullptr, (size_t)size, PROT_READ, MAP_SHARED, fd, 0)
                                                : MAP_FAILED;
  ::close(fd);  // the mapping stays valid
  std::string why;
  if (base == MAP_FAILED) {
    why = size < (int64_t)sizeof(Header) ? strformat("%lld bytes, shorter than its header", (long long)size)
                                         : strformat("mmap failed: %s", std::strerror(errno));
  } else {
    const Header& h = *(const Header*)base;
    char want[sizeof(Header::key)] = {0};
    std::memcpy(want, key.data(), std::min<size_t>(key.size(), sizeof(want) - 1));
    if (std::memcmp(h.magic, kMagic, 8) != 0) why = "not a token cache file (bad magic)";
    else if (h.version != kVersion) why = strformat("format version %u, expected %u", h.version, kVersion);
    else if (std::memcmp(h.key, want, sizeof(want)) != 0) why = "its key does not match its name";
    else if (h.n_examples < 0 || h.n_tokens < 0 || file_bytes(h) != size)
      why = strformat("%lld bytes, expected %lld for %lld examples and %lld tokens", (long long)size,
                      (long long)file_bytes(h), (long long)h.n_examples, (long long)h.n_tokens);
    else {
      const int64_t* off = (const int64_t*)((const char*)base + sizeof(Header));
      bool mono = off[0] == 0 && off[h.n_examples] == h.n_tokens;
      for (int64_t i = 0; mono && i < h.n_examples; i++) mono = off[i] <= off[i + 1];
      if (!mono) why = "its offsets are not a valid partition of its tokens";
      // the contents: a flipped token id would otherwise train on the wrong tokens, silently
      const uint32_t crc = crc32c(0, (const char*)base + sizeof(Header), (size_t)(size - (int64_t)sizeof(Header)));
      if (why.empty() && crc != h.body_crc32c)
        why = strformat("its contents fail their checksum (CRC-32C %08x, the header says %08x)", crc, h.body_crc32c);
      const int32_t* ids = (const int32_t*)(off + h.n_examples + 1);
      if (why.empty() && vocab_size > 0)
        why = first_out_of_vocab(off, h.n_examples, ids, (h.flags & kLabelsAreIds) ? ids : ids + h.n_tokens,
                                 vocab_size);
    }
  }
  if (!why.empty()) {
    if (base != MAP_FAILED) ::munmap(base, (size_t)size);
    log_warn("token cache %s is unusable (%s): removing it and tokenizing again", path.c_str(), why.c_str());
    ::unlink(path.c_str());
    return false;
  }
  const Header& h = *(const Header*)base;
  const int64_t* off = (const int64_t*)((const char*)base + sizeof(Header));
  const int32_t* ids = (const int32_t*)(off + h.n_examples + 1);
  const int32_t* labels = (h.flags & kLabelsAreIds) ? ids : ids + h.n_tokens;
  const size_t len = (size_t)size;
  std::shared_ptr<const void> keep(base, [len](const void* p) { ::munmap(const_cast<void*>(p), len); });
  if (st)
    for (int i = 0; i < 4; i++) st->v[i] = h.stats[i];
  *ds = TokenDataset(keep, h.n_examples, off, ids, labels);
  return true;
}

// Touches the lock file every second while the owner builds, so waiters can tell a live writer from
// one that died.
namespace {
class Heartbeat {
 public:
  explicit Heartbeat(const std::string& path) : path_(path), th_([this] { run(); }) {}
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> g(m_);
      done_ = true;
    }
    cv_.notify_all();
    th_.join();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> g(m_);
    while (!cv_.wait_for(g, std::chrono::seconds(1), [this] { return done_; }))
      ::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);
  }
  std::string path_;
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread th_;
};
}  // namespace

std::string describe_cache_use(CacheUse use, const std::string& path) {
  switch (use) {
    case CacheUse::off: return "no token cache";
    case CacheUse::hit: return "from the token cache " + path;
    case CacheUse::written: return "token cache written " + path;
    case CacheUse::unusable: break;
  }
  return "tokenized without a token cache (" + path + " could not be written)";
}

TokenDataset cached_dataset(const std::string& dir, const std::string& name, const std::string& key,
                            const std::function<TokenDataset(CacheStats*)>& build, CacheStats* st, CacheUse* use,
                            int rank, double stale_s, int64_t vocab_size) {
  CacheStats local;
  CacheUse unused;
  if (!st) st = &local;
  if (!use) use = &unused;
  *use = CacheUse::off;
  if (dir.empty()) return build(st);
  *use = CacheUse::unusable;  // until a file is mapped or written
  try {
    make_dirs(dir);
  } catch (const Error& e) {
    log_warn("%s; tokenizing without a cache", e.what());
    return build(st);
  }
  const std::string path = token_cache_path(dir, name, key), lock = path + ".lock";
  using clock = std::chrono::steady_clock;
  bool said_waiting = false;
  struct timespec last_mtime = {0, 0};
  clock::time_point last_change = clock::now();
  if (rank != 0) {
    struct stat sb;
    for (int i = 0; i < 20 && ::stat(path.c_str(), &sb) != 0 && ::stat(lock.c_str(), &sb) != 0; i++)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (;;) {
    TokenDataset ds;
    if (map_token_cache(path, key, &ds, st, vocab_size)) {
      *use = CacheUse::hit;
      return ds;
    }
    int fd = ::open(lock.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd >= 0) {
      std::string who = host_name() + " pid " + std::to_string((long)::getpid()) + "\n";
      ssize_t wr = ::write(fd, who.data(), who.size());
      (void)wr;  // the content is only for people reading the lock
      ::close(fd);
      // Another writer may have finished between our look and our lock.
      if (map_token_cache(path, key, &ds, st, vocab_size)) {
        ::unlink(lock.c_str());
        *use = CacheUse::hit;
        return ds;
      }
      try {
        Heartbeat hb(lock);
        ds = build(st);
      } catch (...) {
        ::unlink(lock.c_str());  // bad data is the user's error: let the waiters find it too
        throw;
      }
      try {
        write_token_cache(path, key, ds, *st);
      } catch (const Error& e) {
        ::unlink(lock.c_str());
        log_warn("%s; using the tokenized data from memory", e.what());
        return ds;
      }
      ::unlink(lock.c_str());
      *use = CacheUse::written;
      TokenDataset mapped;
      CacheStats st2;
      if (map_token_cache(path, key, &mapped, &st2, vocab_size)) return mapped;  // page cache, shared by the ranks of a node
      return ds;
    }
    if (errno != EEXIST) {
      log_warn("cannot create %s (%s); tokenizing without a cache", lock.c_str(), std::strerror(errno));
      return build(st);
    }
    // Someone else is tokenizing: wait for the file, watching that its lock stays alive.
    struct stat sb;
    if (::stat(lock.c_str(), &sb) == 0) {
      if (sb.st_mtim.tv_sec != last_mtime.tv_sec || sb.st_mtim.tv_nsec != last_mtime.tv_nsec) {
        last_mtime = sb.st_mtim;
        last_change = clock::now();
      } else if (std::chrono::duration<double>(clock::now() - last_change).count() > stale_s) {
        log_warn("token cache lock %s has not moved for %.1f s: its writer seems gone; taking over", lock.c_str(),
                 stale_s);
        ::unlink(lock.c_str());
        last_change = clock::now();
        continue;
      }
    }
    throw_if_stopped("waiting for the token cache " + path);
    if (!said_waiting) {
      log_info("data   waiting for another process to write the token cache %s", path.c_str());
      said_waiting = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string cache_entry_name(const std::string& prefix, const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') + 1);
  for (char& c : base)
    if (!std::isalnum((unsigned char)c) && c != '.' && c != '-' && c != '_') c = '_';
  return prefix + base;
}

void overwrite_cache_entry(bool overwrite, int rank, const std::string& dir, const std::string& name,
                           const std::string& key, const std::string& what) {
  if (!overwrite || rank != 0 || dir.empty()) return;
  const std::string file = token_cache_path(dir, name, key);
  if (::unlink(file.c_str()) == 0) log_info("data   %s: --overwrite_cache: removed %s", what.c_str(), file.c_str());
}

}  // namespace llmt
