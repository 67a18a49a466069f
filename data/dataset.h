// Tokenized datasets for training and evaluation: Alpaca instruction records (data/alpaca.h) and
// run_clm-style grouped text (data/wikitext.h), built once and kept in the token cache
// (data/token_cache.h). docs/data.md describes formats, templates, masking and the cache.
//
// A dataset is a list of examples, each a run of input ids with labels aligned to them in the
// Hugging Face convention: labels[t] is the id at t, or -100 where no loss is taken; the model (here
// collate()) shifts them so position t predicts labels[t + 1]. Storage is flat, offsets[n + 1] into
// one ids array and one labels array, so a cache file can be memory-mapped as it is.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/utf8.h"  // find_invalid_utf8, which the dataset readers check text with
#include "engine/core/tensor.h"

namespace llmt {

class Tokenizer;

class TokenDataset {
 public:
  TokenDataset() = default;  // empty: no examples
  // Owns the vectors. offsets has n + 1 entries, offsets[0] = 0, non-decreasing, offsets[n] = ids.size().
  // An empty `labels` means labels equal ids (run_clm: labels = input_ids), stored once.
  TokenDataset(std::vector<int64_t> offsets, std::vector<int32_t> ids, std::vector<int32_t> labels);
  // Views memory kept alive by `keep` (a mapped cache file); labels may equal ids.
  TokenDataset(std::shared_ptr<const void> keep, int64_t n, const int64_t* offsets, const int32_t* ids,
               const int32_t* labels);

  int64_t size() const { return n_; }
  int64_t length(int64_t i) const { return offsets_[i + 1] - offsets_[i]; }
  const int32_t* ids(int64_t i) const { return ids_ + offsets_[i]; }
  const int32_t* labels(int64_t i) const { return labels_ + offsets_[i]; }
  int64_t total_tokens() const { return n_ > 0 ? offsets_[n_] : 0; }
  bool empty() const { return n_ == 0; }
  bool labels_are_ids() const { return labels_ == ids_; }
  int64_t max_length() const;
  // Flat views for the cache writer.
  const int64_t* offsets_data() const { return offsets_; }
  const int32_t* ids_data() const { return ids_; }
  const int32_t* labels_data() const { return labels_; }

 private:
  std::shared_ptr<const void> keep_;  // owned vectors or the mapping; shared, so copies are cheap
  int64_t n_ = 0;
  const int64_t* offsets_ = nullptr;
  const int32_t* ids_ = nullptr;
  const int32_t* labels_ = nullptr;
};

struct DataArgs {
  std::string data_path;  // Alpaca JSON array or JSON Lines (--data_path)
  // --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 | wikitext-103-raw-v1 | wikitext-2-v1 |
  // wikitext-103-v1, resolved to local files under --dataset_dir (nothing is downloaded)
  std::string dataset_name, dataset_config_name, dataset_dir;
  std::string train_file, validation_file;  // run_clm's file types: .txt, .json/.jsonl, .csv (text_files.h)
  bool keep_linebreaks = true;              // run_clm: a .txt line keeps its "\n"
  int block_size = 0;                       // run_clm grouping; 0 is an error here: the caller decides
  int model_max_length = 512;               // Alpaca truncation (Stanford's default)
  std::string instruction_field = "instruction", input_field = "input", output_field = "output";
  // chat data given by --data_path (data/conversations.h): the template (a Jinja file or a
  // tokenizer_config.json; empty: the tokenizer's), and what takes loss (TRL's SFTConfig names)
  std::string chat_template;
  bool assistant_only_loss = true;   // messages / conversations records: loss on assistant turns only
  bool completion_only_loss = true;  // prompt / completion records: loss on the completion only
  std::string cache_dir;  // token cache: see resolve_cache_dir (token_cache.h); "none" turns it off
  bool overwrite_cache = false;       // tokenize again and rewrite the cache file
  int preprocessing_num_workers = 0;  // threads that tokenize (0: OpenMP's default, the rank's threads)
  // run_clm: with --train_file and no --validation_file, the first N% of the train file's lines are the
  // validation split and the rest the train split (0: no split)
  int validation_split_percentage = 0;
  // The directory or file the tokenizer was loaded from (load_tokenizer's argument): its files' content
  // goes into the cache key. Empty: the key uses a fingerprint computed through the tokenizer instead.
  std::string tokenizer_path;
};

// What identifies a training dataset across runs (a checkpoint records it, a resume compares it):
// the token cache key, a hash of the data's content, the tokenizer's files and every setting that
// changes the tokens (block_size, model_max_length, the split, the fields), whether or not a cache
// is used; and beside it what a person can read, to say what differs.
struct DataIdentity {
  std::string key;           // the token cache key: equal keys, equal tokens
  std::string source;        // "--train_file PATH", "--data_path PATH", "--dataset_name wikitext CONFIG"
  int block_size = 0;        // run_clm grouping (text data); 0 for Alpaca
  int model_max_length = 0;  // Alpaca truncation; 0 for text data
  int64_t examples = 0, tokens = 0;
};

// Builds (or maps from the token cache) the training dataset the args name; logs counts on rank 0.
// Every rank builds the whole dataset (the sampler picks each rank's examples); with a cache, one
// process tokenizes and the others wait for its file. *id (when given) gets its identity.
TokenDataset load_train_dataset(const DataArgs& args, const Tokenizer& tok, int rank, int world,
                                DataIdentity* id = nullptr);
// The evaluation dataset: --validation_file, or the validation split of --dataset_name; empty if none
// (Alpaca has none, as in Stanford's train.py).
TokenDataset load_eval_dataset(const DataArgs& args, const Tokenizer& tok, int rank, int world);

// The pad id collate() should get: always masked (targets -100, right padding behind a causal mask),
// so any id in the vocabulary works and no [PAD] token or embedding resize is needed: EOS, else 0.
int default_pad_id(const Tokenizer& tok);

// Pads examples idx (right) to the longest of them: returns T and fills tokens[B*T] (pad_id beyond an
// example's length) and targets[B*T], targets[b*T + t] = labels[b][t + 1] for t + 1 < len, else -100
// (the shift Hugging Face's causal-LM loss applies).
int collate(const TokenDataset& ds, const std::vector<int64_t>& idx, int pad_id, std::vector<int32_t>& tokens,
            std::vector<int32_t>& targets);

// ---- helpers the builders share ----

// Refuses a data file that is not a regular file (a device such as /dev/zero, a pipe, a directory:
// hashing /dev/zero never ended; opening a pipe waits for a writer), naming `what` (the flag), the
// path and what it is. A path that cannot be stat'ed is left for the caller's open to report.
void check_regular_file(const std::string& path, const std::string& what);
// The content of a regular data file, read in chunks; a stop signal (engine/core/stop.h) ends the
// read with an error. Errors name `what` and the path.
std::string read_data_file(const std::string& path, const std::string& what);

// 1-based line and byte column of offset pos in s.
void line_and_column(std::string_view s, int64_t pos, int64_t* line, int64_t* col);
// Whether Tokenizer::encode may run on several OpenMP threads at once for this tokenizer (decided per
// implementation, see dataset.cpp).
bool tokenizer_thread_safe(const Tokenizer& tok);

// --preprocessing_num_workers for the scope it lives in: OpenMP's thread count while tokenizing
// (workers > 0), put back as it was afterwards, since the same threads then compute.
class TokenizeThreads {
 public:
  explicit TokenizeThreads(int workers);
  ~TokenizeThreads();
  TokenizeThreads(const TokenizeThreads&) = delete;
  TokenizeThreads& operator=(const TokenizeThreads&) = delete;
  std::string describe(bool parallel) const;  // "4 threads" / "one thread" for the log line

 private:
  int saved_ = 0, workers_ = 0;
};

}  // namespace llmt
