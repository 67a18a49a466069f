#include "data/dataset.h"

#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <new>
#include <cstdio>
#include <cstring>

#include "data/alpaca.h"
#include "data/conversations.h"
#include "data/tokenizer.h"
#include "data/wikitext.h"
#include "engine/core/error.h"
#include "engine/core/stop.h"

namespace llmt {

namespace {
struct OwnedStorage {
  std::vector<int64_t> offsets;
  std::vector<int32_t> ids, labels;
};
}  // namespace

TokenDataset::TokenDataset(std::vector<int64_t> offsets, std::vector<int32_t> ids, std::vector<int32_t> labels) {
  LLMT_CHECK(!offsets.empty() && offsets.front() == 0 && offsets.back() == (int64_t)ids.size(),
             "TokenDataset: offsets must run from 0 to the %zu ids", ids.size());
  LLMT_CHECK(labels.empty() || labels.size() == ids.size(), "TokenDataset: %zu labels for %zu ids", labels.size(),
             ids.size());
  for (size_t i = 0; i + 1 < offsets.size(); i++)
    LLMT_CHECK(offsets[i] <= offsets[i + 1], "TokenDataset: offsets decrease at example %zu", i);
  auto s = std::make_shared<OwnedStorage>();
  s->offsets = std::move(offsets);
  s->ids = std::move(ids);
  s->labels = std::move(labels);
  n_ = (int64_t)s->offsets.size() - 1;
  offsets_ = s->offsets.data();
  ids_ = s->ids.data();
  labels_ = s->labels.empty() ? ids_ : s->labels.data();
  keep_ = std::move(s);
}

TokenDataset::TokenDataset(std::shared_ptr<const void> keep, int64_t n, const int64_t* offsets, const int32_t* ids,
                           const int32_t* labels)
    : keep_(std::move(keep)), n_(n), offsets_(offsets), ids_(ids), labels_(labels) {}

int64_t TokenDataset::max_length() const {
  int64_t m = 0;
  for (int64_t i = 0; i < n_; i++) m = std::max(m, length(i));
  return m;
}

// ---- which data the args name ----

static bool is_wikitext(const std::string& name) { return name == "wikitext" || name == "Salesforce/wikitext"; }

static void check_sources(const DataArgs& a) {
  const int n = !a.data_path.empty() + !a.dataset_name.empty() + !a.train_file.empty();
  LLMT_CHECK(n == 1,
             n == 0 ? "no training data: give --data_path (Alpaca JSON), --dataset_name wikitext with --dataset_dir, "
                      "or --train_file (plain text)"
                    : "give one of --data_path, --dataset_name and --train_file, not several");
  LLMT_CHECK(a.dataset_name.empty() || is_wikitext(a.dataset_name),
             "--dataset_name %s: llmt reads only wikitext from local files (--dataset_dir); for other text use "
             "--train_file",
             a.dataset_name.c_str());
  LLMT_CHECK(a.dataset_name.empty() || !a.dataset_config_name.empty(),
             "--dataset_name wikitext needs --dataset_config_name (wikitext-2-raw-v1, wikitext-103-raw-v1, ...)");
  LLMT_CHECK(a.validation_split_percentage == 0 || !a.train_file.empty() || !a.dataset_name.empty(),
             "--validation_split_percentage carves a validation split from --train_file (run_clm); Alpaca data "
             "has no evaluation set");
  LLMT_CHECK(a.validation_file.empty() || !a.train_file.empty(),
             "--validation_file goes with --train_file (plain text); with --dataset_name the validation split is "
             "used, and Alpaca data has no evaluation set");
}

TokenDataset load_train_dataset(const DataArgs& a, const Tokenizer& tok, int rank, int world, DataIdentity* id) {
  (void)world;  // every rank builds the whole dataset; the sampler splits it
  check_sources(a);
  DataIdentity local;
  if (!id) id = &local;
  TokenDataset ds;
  if (!a.data_path.empty()) {
    const RecordFormat f = detect_record_format(a.data_path, a);  // Alpaca, messages, ShareGPT, prompt-completion
    ds = f == RecordFormat::alpaca ? load_alpaca_dataset(a, tok, rank, &id->key)
                                   : load_chat_dataset(a, f, tok, rank, &id->key);
    id->source = "--data_path " + a.data_path;
    id->model_max_length = a.model_max_length;
  } else {
    if (!a.dataset_name.empty())
      ds = load_text_dataset(wikitext_split_file(a.dataset_dir, a.dataset_config_name, "train"), LineRule::kWikitext,
                             a, tok, rank, a.dataset_config_name + " train", {}, &id->key);
    else if (a.validation_file.empty() && a.validation_split_percentage > 0)  // run_clm: train[N%:]
      ds = load_text_dataset(a.train_file, LineRule::kTextLoader, a, tok, rank,
                             strformat("train (after the first %d%%)", a.validation_split_percentage),
                             {a.validation_split_percentage, false}, &id->key);
    else
      ds = load_text_dataset(a.train_file, LineRule::kTextLoader, a, tok, rank, "train", {}, &id->key);
    id->source = !a.dataset_name.empty() ? "--dataset_name " + a.dataset_name + " " + a.dataset_config_name
                                         : "--train_file " + a.train_file;
    if (a.validation_file.empty() && a.validation_split_percentage > 0)
      id->source += strformat(" (after the first %d%%)", a.validation_split_percentage);
    id->block_size = a.block_size;
  }
  id->examples = ds.size();
  id->tokens = ds.total_tokens();
  return ds;
}

TokenDataset load_eval_dataset(const DataArgs& a, const Tokenizer& tok, int rank, int world) {
  (void)world;
  check_sources(a);
  if (!a.dataset_name.empty())
    return load_text_dataset(wikitext_split_file(a.dataset_dir, a.dataset_config_name, "validation"),
                             LineRule::kWikitext, a, tok, rank, a.dataset_config_name + " validation");
  if (!a.validation_file.empty())
    return load_text_dataset(a.validation_file, LineRule::kTextLoader, a, tok, rank, "validation");
  if (!a.train_file.empty() && a.validation_split_percentage > 0)  // run_clm: train[:N%]
    return load_text_dataset(a.train_file, LineRule::kTextLoader, a, tok, rank,
                             strformat("validation (the first %d%% of train)", a.validation_split_percentage),
                             {a.validation_split_percentage, true});
  return TokenDataset();
}

int default_pad_id(const Tokenizer& tok) { return tok.eos_id() >= 0 ? tok.eos_id() : 0; }

int collate(const TokenDataset& ds, const std::vector<int64_t>& idx, int pad_id, std::vector<int32_t>& tokens,
            std::vector<int32_t>& targets) {
  LLMT_CHECK(!idx.empty(), "collate: no examples");
  int64_t T = 0;
  for (int64_t i : idx) {
    LLMT_CHECK(i >= 0 && i < ds.size(), "collate: example %lld of a dataset of %lld", (long long)i,
               (long long)ds.size());
    T = std::max(T, ds.length(i));
  }
  LLMT_CHECK(T >= 1 && T <= INT_MAX, "collate: the longest example has %lld tokens", (long long)T);
  const int64_t B = (int64_t)idx.size();
  tokens.assign((size_t)(B * T), pad_id);
  targets.assign((size_t)(B * T), kIgnoreIndex);
  for (int64_t b = 0; b < B; b++) {
    const int64_t len = ds.length(idx[(size_t)b]);
    const int32_t* x = ds.ids(idx[(size_t)b]);
    const int32_t* y = ds.labels(idx[(size_t)b]);
    int32_t* tok = tokens.data() + b * T;
    int32_t* tgt = targets.data() + b * T;
    for (int64_t t = 0; t < len; t++) tok[t] = x[t];
    for (int64_t t = 0; t + 1 < len; t++) tgt[t] = y[t + 1];  // the shift: position t predicts label t + 1
  }
  return (int)T;
}

// ---- helpers ----

void check_regular_file(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return;  // absent or unreadable: opening it says so
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISFIFO(st.st_mode) ? "a pipe"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : nullptr;
  LLMT_CHECK(S_ISREG(st.st_mode), "%s: %s is %s, not a regular file: llmt hashes data files for the token cache "
             "and the checkpoint's record, then reads them, so they must be files of a known size",
             what.c_str(), path.c_str(), kind ? kind : "not a regular file");
}

std::string read_data_file(const std::string& path, const std::string& what) {
  check_regular_file(path, what);
  FILE* f = std::fopen(path.c_str(), "rb");
  LLMT_CHECK(f, "cannot open %s %s: %s", what.c_str(), path.c_str(), std::strerror(errno));
  std::string text;
  struct stat st;
  const long long size = ::fstat(fileno(f), &st) == 0 ? (long long)st.st_size : 0;
  std::vector<char> buf(1 << 20);
  try {
    if (size > 0) text.reserve((size_t)size);
  } catch (const std::bad_alloc&) {
    std::fclose(f);
    fail("%s: %s is %lld bytes, more than this process can hold in memory (it is read whole)", what.c_str(),
         path.c_str(), size);
  }
  for (;;) {
    const size_t got = std::fread(buf.data(), 1, buf.size(), f);
    text.append(buf.data(), got);
    if (got < buf.size()) break;
    if (stop_now()) {
      std::fclose(f);
      throw_if_stopped("reading " + path);
    }
  }
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  LLMT_CHECK(!bad, "%s: read error in %s", what.c_str(), path.c_str());
  return text;
}

void line_and_column(std::string_view s, int64_t pos, int64_t* line, int64_t* col) {
  pos = std::max<int64_t>(0, std::min<int64_t>(pos, (int64_t)s.size()));
  int64_t l = 1, start = 0;
  for (int64_t i = 0; i < pos; i++)
    if (s[(size_t)i] == '\n') l++, start = i + 1;
  *line = l;
  *col = pos - start + 1;
}

bool tokenizer_thread_safe(const Tokenizer& tok) {
  // Read from the implementations: byte-level BPE and tiktoken (data/bpe_bytelevel.cpp) keep their word
  // cache thread_local; SentencePiece BPE and the byte tokenizer keep no mutable state. Any other
  // kind (a test double, a tokenizer added later) runs on one thread until someone checks it.
  const std::string k = tok.kind();
  return k == "gpt2-bpe" || k == "tiktoken" || k == "sentencepiece-bpe" || k == "bytes";
}

TokenizeThreads::TokenizeThreads(int workers) : saved_(omp_get_max_threads()), workers_(workers) {
  if (workers_ > 0) omp_set_num_threads(workers_);
}

TokenizeThreads::~TokenizeThreads() {
  if (workers_ > 0) omp_set_num_threads(saved_);
}

std::string TokenizeThreads::describe(bool parallel) const {
  if (!parallel) return "one thread";
  const int n = omp_get_max_threads();
  return strformat("%d thread%s%s", n, n == 1 ? "" : "s", workers_ > 0 ? ", --preprocessing_num_workers" : "");
}

}  // namespace llmt
