// The token cache: each tokenized dataset is written once to a binary file named by a key (a hash of
// the data file's content, the tokenizer's files and every setting that changes the tokens), then
// memory-mapped on every later start, so a second run skips tokenization.
//
// File layout (native little-endian), docs/data.md has the details:
//   header, 128 bytes: magic "LLMTTOK1", u32 version, u32 flags (bit 0: labels equal ids, not stored),
//                      i64 n_examples, i64 n_tokens, i64 stats[4] (builder counters), char key[56],
//                      u32 CRC-32C of the body (checked on every map), u32 reserved
//   i64 offsets[n_examples + 1]; i32 ids[n_tokens]; i32 labels[n_tokens] (unless flag bit 0)
// Written under a unique temporary name and renamed, so a file is complete or absent. When several
// processes start at once, one takes `<file>.lock` (O_EXCL) and tokenizes; the others wait for the
// file (a lock whose mtime stops moving for stale_s is taken over: the writer touches it every few s).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "data/dataset.h"

namespace llmt {

class Tokenizer;

// 128-bit non-cryptographic hash for cache keys; every add is length-prefixed so fields cannot run
// into each other. Files are streamed in fixed chunks.
class KeyHasher {
 public:
  KeyHasher& add(std::string_view bytes);
  KeyHasher& add_int(int64_t v);
  KeyHasher& add_file(const std::string& path);  // content; throws naming the file if unreadable
  std::string hex() const;                       // 32 hex digits

 private:
  void fold(uint64_t a, uint64_t b);
  uint64_t h0_ = 0x6a09e667f3bcc908ull, h1_ = 0xbb67ae8584caa73bull;
};

// Adds what identifies the tokenizer: kind, vocab size, special ids and defaults, and the content of
// its files under `path` (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
// added_tokens.json, vocab.json, merges.txt, tokenizer.model, *.tiktoken; or `path` itself when it is a
// file). With an empty path, a fingerprint made through the tokenizer (decode of every id, encode of a
// probe text) stands in for the files.
void add_tokenizer_to_key(KeyHasher& h, const Tokenizer& tok, const std::string& path);

// --cache_dir, else $LLMT_CACHE, else $XDG_CACHE_HOME/llmt, else ~/.cache/llmt; "none" (flag or variable) = no cache.
std::string resolve_cache_dir(const std::string& flag);

struct CacheStats {
  int64_t v[4] = {0, 0, 0, 0};  // what the builder counted (truncations, ...), kept so a hit can report them
};

// `<dir>/<name>-<key>.tokens`
std::string token_cache_path(const std::string& dir, const std::string& name, const std::string& key);
// The entry name for a data file: prefix + the file's base name, any byte but [A-Za-z0-9._-] as '_'.
std::string cache_entry_name(const std::string& prefix, const std::string& path);
// --overwrite_cache: rank 0 removes the entry (dir "" is no cache) so that it is built again, and
// says so, naming `what`.
void overwrite_cache_entry(bool overwrite, int rank, const std::string& dir, const std::string& name,
                           const std::string& key, const std::string& what);
// Writes ds atomically (unique temporary + rename). Throws naming the file on an I/O error.
void write_token_cache(const std::string& path, const std::string& key, const TokenDataset& ds, const CacheStats& st);
// Maps the file when present and valid for `key`. Returns false when absent; a damaged or mismatched
// file is reported, removed and also gives false. With vocab_size > 0, an id outside [0, vocab_size)
// or a label outside it that is not -100 also makes the file unusable (the warning names the file,
// the example and the position), where it would otherwise stop training at the embedding.
bool map_token_cache(const std::string& path, const std::string& key, TokenDataset* ds, CacheStats* st,
                     int64_t vocab_size = 0);

// What cached_dataset did with the cache.
enum class CacheUse {
  off,       // no cache directory: tokenized
  hit,       // mapped from the cache file
  written,   // tokenized, and the cache file written (or written by another process meanwhile)
  unusable,  // tokenized, and no file written: the directory or file could not be made (a warning said why)
};
// How the data line says it: "from the token cache PATH", "token cache written PATH", "no token cache",
// "tokenized without a token cache (PATH could not be written)".
std::string describe_cache_use(CacheUse use, const std::string& path);

// The dataset for `key`: mapped from the cache when there, else build()-ed, written and returned.
// dir "" builds without caching. *use tells which. Cache trouble (unwritable dir, full disk) is a
// warning and the built dataset is used from memory. Ranks other than 0 give rank 0 a moment to take
// the lock first, so the tokenizing process is the one that prints.
// vocab_size > 0 bounds the ids of a mapped file, as in map_token_cache.
TokenDataset cached_dataset(const std::string& dir, const std::string& name, const std::string& key,
                            const std::function<TokenDataset(CacheStats*)>& build, CacheStats* st, CacheUse* use,
                            int rank = 0, double stale_s = 60.0, int64_t vocab_size = 0);

}  // namespace llmt
