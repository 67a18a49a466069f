#include "engine/dist/agree.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>

#include "engine/core/error.h"

namespace llmt {

namespace {

// name TAB value NEWLINE per field; a value's own tabs and newlines are escaped so it parses back.
std::string serialise(const ConfigFields& fields) {
  std::string s;
  for (const auto& [name, value] : fields) {
    s += name;
    s += '\t';
    for (char c : value) {
      if (c == '\\') s += "\\\\";
      else if (c == '\n') s += "\\n";
      else if (c == '\t') s += "\\t";
      else s += c;
    }
    s += '\n';
  }
  return s;
}

ConfigFields parse(const std::string& s) {
  ConfigFields out;
  for (size_t at = 0; at < s.size();) {
    size_t nl = s.find('\n', at);
    if (nl == std::string::npos) nl = s.size();
    const std::string line = s.substr(at, nl - at);
    at = nl + 1;
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    std::string value;
    for (size_t i = tab + 1; i < line.size(); i++) {
      if (line[i] == '\\' && i + 1 < line.size()) {
        const char c = line[++i];
        value += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        value += line[i];
      }
    }
    out.emplace_back(line.substr(0, tab), value);
  }
  return out;
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// "0, 2, 5" (at most 8, then "and N more")
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  const size_t shown = std::min<size_t>(ranks.size(), 8);
  for (size_t i = 0; i < shown; i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > shown) s += strformat(" and %zu more", ranks.size() - shown);
  return s;
}

std::string shown_value(const std::string* v) {
  if (!v) return "(not set on this rank: another llmt version?)";
  std::string s = v->empty() ? "\"\"" : *v;
  if (s.size() > 160) s = s.substr(0, 150) + "...";
  return s;
}

}  // namespace

std::string describe_disagreement(const std::string& what, const std::vector<ConfigFields>& by_rank) {
  // field names in rank 0's order, then any only other ranks have
  std::vector<std::string> names;
  std::map<std::string, bool> seen;
  std::vector<std::map<std::string, std::string>> maps(by_rank.size());
  for (size_t r = 0; r < by_rank.size(); r++)
    for (const auto& [name, value] : by_rank[r]) {
      maps[r][name] = value;
      if (!seen[name]) names.push_back(name), seen[name] = true;
    }
  std::vector<std::string> differ;
  for (const std::string& name : names) {
    // the distinct values in order of their first rank, each with its ranks
    std::vector<const std::string*> values;
    std::vector<std::vector<int>> holders;
    for (size_t r = 0; r < maps.size(); r++) {
      auto it = maps[r].find(name);
      const std::string* v = it == maps[r].end() ? nullptr : &it->second;
      size_t k = 0;
      while (k < values.size() && !((values[k] == nullptr && v == nullptr) || (values[k] && v && *values[k] == *v))) k++;
      if (k == values.size()) values.push_back(v), holders.emplace_back();
      holders[k].push_back((int)r);
    }
    if (values.size() < 2) continue;
    std::string d = name + ":";
    for (size_t k = 0; k < values.size(); k++)
      d += strformat("%s %s on rank%s %s", k ? ";" : "", shown_value(values[k]).c_str(),
                     holders[k].size() == 1 ? "" : "s", rank_list(holders[k]).c_str());
    differ.push_back(d);
  }
  if (differ.empty()) return "";
  std::string msg = strformat("the ranks disagree on their %s (every rank must run the same job): ", what.c_str());
  const size_t shown = std::min<size_t>(differ.size(), 12);
  for (size_t i = 0; i < shown; i++) msg += (i ? " | " : "") + differ[i];
  if (differ.size() > shown) msg += strformat(" | and %zu more field%s", differ.size() - shown,
                                              differ.size() - shown == 1 ? "" : "s");
  return msg;
}

void check_ranks_agree(ControlComm& world, const std::string& what, const ConfigFields& fields) {
  const int W = world.size();
  if (W == 1) return;
  const std::string text = serialise(fields);
  LLMT_CHECK(text.size() < (1u << 30), "the %s is too large to compare (%zu bytes)", what.c_str(), text.size());
  const uint64_t h = fnv1a64(text);
  const int32_t mine[4] = {(int32_t)(uint32_t)h, (int32_t)(uint32_t)(h >> 32), (int32_t)text.size(), 0};
  std::vector<int32_t> all((size_t)W * 4);
  world.all_gather(mine, all.data(), 4, DType::i32);
  bool same = true;
  int32_t longest = 0;
  for (int r = 0; r < W; r++) {
    same = same && std::equal(all.begin() + 4 * r, all.begin() + 4 * r + 4, all.begin());
    longest = std::max(longest, all[(size_t)4 * r + 2]);
  }
  if (same) return;
  // Every rank saw the same digests, so every rank is here: gather the texts, padded to the longest.
  const int64_t words = (longest + 3) / 4;
  std::vector<int32_t> padded((size_t)std::max<int64_t>(words, 1), 0);
  std::memcpy(padded.data(), text.data(), text.size());
  std::vector<int32_t> texts((size_t)std::max<int64_t>(words, 1) * W);
  world.all_gather(padded.data(), texts.data(), std::max<int64_t>(words, 1), DType::i32);
  std::vector<ConfigFields> by_rank;
  for (int r = 0; r < W; r++) {
    const char* p = (const char*)(texts.data() + (size_t)r * std::max<int64_t>(words, 1));
    by_rank.push_back(parse(std::string(p, (size_t)all[(size_t)4 * r + 2])));
  }
  std::string msg = describe_disagreement(what, by_rank);
  if (msg.empty()) msg = strformat("the ranks disagree on their %s (a digest differs, no field does)", what.c_str());
  throw Error(msg);
}

void agree_or_throw(ControlComm& world, bool ok, const std::string& what) {
  if (world.all_reduce_sum(ok ? 0.0 : 1.0) == 0.0) return;
  const int W = world.size(), me = world.rank();
  std::vector<int32_t> failed((size_t)W);
  int32_t mine = ok ? 0 : 1;
  world.all_gather(&mine, failed.data(), 1, DType::i32);
  int root = (int)(std::find(failed.begin(), failed.end(), 1) - failed.begin());
  int32_t len = root == me ? (int32_t)what.size() : 0;
  world.broadcast(&len, 1, DType::i32, root);
  std::vector<int32_t> words((size_t)(len + 3) / 4 + 1, 0);
  if (root == me) std::memcpy(words.data(), what.data(), what.size());
  world.broadcast(words.data(), (int64_t)words.size(), DType::i32, root);
  std::string msg((const char*)words.data(), (size_t)len);
  if (W > 1) msg = strformat("rank %d: %s", root, msg.c_str());
  throw Error(msg);
}

}  // namespace llmt
