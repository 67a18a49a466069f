// Packed documents through the whole model: a row holding several documents (positions restarting,
// attention inside each) gives the loss and every gradient that the documents give run one by one,
// on the CPU and the CUDA backend (the emulator), in fp32 (the order of additions is all that
// differs) and in bf16 (the tensor-core attention on the emulator).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/formats/safetensors.h"
#include "engine/fsdp/fsdp.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/hf_checkpoint.h"
#include "models/transformer.h"
#include "tests/test_util.h"

using namespace llmt;

namespace {

std::vector<float> host_floats(Backend& be, const Tensor& t) {
  std::vector<float> out((size_t)t.numel());
  be.copy_to_host(out.data(), t.data, t.nbytes());
  return out;
}

// Loss sum and every unit's gradient of `docs` (token lists), packed into rows of T (`rows`: the
// documents of each row, in order) or, with rows empty, each document alone as a batch of one.
struct Result {
  double loss = 0;
  std::vector<std::vector<float>> grads;
};
Result run(const std::string& fixture, const std::string& device, DType dt, const std::vector<std::vector<int32_t>>& docs,
           const std::vector<std::vector<int>>& rows, int T, int64_t head_chunk = 0) {
  const std::string dir = llmt_test::reference_dir() + "/" + fixture;
  const ModelConfig cfg = config_from_json_file(dir + "/config.json");
  std::unique_ptr<Backend> be = device == "cpu" ? make_cpu_backend(2, dt) : make_cuda_backend(0, dt, false);
  const int B = rows.empty() ? 1 : (int)rows.size();
  Transformer model(cfg, *be, B, T, false, head_chunk);
  const ModelLayout& L = model.layout();
  std::unique_ptr<DataComm> solo = make_solo_data_comm();
  FsdpStore store(*be, L, Strategy::no_shard, *solo, 1);
  SafetensorsCheckpoint ckpt(dir);
  for (size_t u = 0; u < L.units.size(); u++) {
    std::vector<float> host((size_t)L.units[u].numel);
    load_hf_unit(ckpt, cfg, L, (int)u, host.data());
    store.set_unit((int)u, host.data());
  }
  BackendBuffer loss(*be, DType::f64, {1});
  TrainPass pass;  // grad_scale 1: gradients of the loss sum
  store.zero_grads();
  // a document's targets: each token predicts the next of the same document; its last predicts nothing
  auto targets_of = [](const std::vector<int32_t>& d, int32_t* out) {
    for (size_t i = 0; i < d.size(); i++) out[i] = i + 1 < d.size() ? d[i + 1] : kIgnoreIndex;
  };
  if (rows.empty()) {
    for (const auto& d : docs) {
      std::vector<int32_t> tgt(d.size());
      targets_of(d, tgt.data());
      model.forward(store, d.data(), tgt.data(), (int)d.size(), loss.tensor(), &pass);
      model.backward(store);
    }
  } else {
    std::vector<int32_t> tok((size_t)B * T, 0), tgt((size_t)B * T, kIgnoreIndex), start((size_t)B * T, 0);
    for (int b = 0; b < B; b++) {
      int at = 0;
      for (int k : rows[(size_t)b]) {
        const auto& d = docs[(size_t)k];
        std::copy(d.begin(), d.end(), tok.begin() + (size_t)b * T + at);
        targets_of(d, tgt.data() + (size_t)b * T + at);
        for (size_t i = 0; i < d.size(); i++) start[(size_t)b * T + at + i] = at;
        at += (int)d.size();
      }
      for (int t = at; t < T; t++) start[(size_t)b * T + t] = at;  // the padding: a document of its own
    }
    model.forward(store, tok.data(), tgt.data(), T, loss.tensor(), &pass, start.data());
    model.backward(store);
  }
  Result r;
  be->copy_to_host(&r.loss, loss.tensor().data, sizeof(double));
  for (size_t u = 0; u < L.units.size(); u++) r.grads.push_back(host_floats(*be, store.shard_state((int)u).grad));
  return r;
}

TEST(Packing, PackedRowsGiveEachDocumentsLossAndGradients) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> id(3, 250);
  const std::vector<int> lengths = {5, 1, 7, 13, 4, 6};
  std::vector<std::vector<int32_t>> docs;
  for (int n : lengths) {
    docs.emplace_back();
    for (int i = 0; i < n; i++) docs.back().push_back(id(rng));
  }
  const std::vector<std::vector<int>> rows = {{0, 1, 2}, {3}, {4, 5}};  // 13, 13 and 10 tokens of 13
  for (const char* fixture : {"gpt2_tiny", "llama_tiny", "qwen2_tiny"})
    for (const char* device : {"cpu", "cuda"})
      for (DType dt : {DType::f32, DType::bf16}) {
        SCOPED_TRACE(::testing::Message() << fixture << " " << device << " " << dtype_name(dt));
        const Result alone = run(fixture, device, dt, docs, {}, 13), packed = run(fixture, device, dt, docs, rows, 13);
        const double tol = dt == DType::f32 ? 1e-5 : 3e-2;
        EXPECT_NEAR(packed.loss, alone.loss, tol * std::fabs(alone.loss)) << "the loss sum";
        for (size_t u = 0; u < alone.grads.size(); u++)
          EXPECT_LT(llmt_test::rel_error(packed.grads[u].data(), alone.grads[u].data(), (int64_t)alone.grads[u].size()),
                    dt == DType::f32 ? 1e-5 : 6e-2)
              << "unit " << u << "'s gradient";
      }
}

// LongRoPE picks its factor set by the batch's largest position + 1, as transformers does with
// position_ids: documents of at most phi3_longrope_tiny's original 8 tokens packed into rows of 13
// keep the short set and give what each gives alone; with a document of 9 in the batch every
// document takes the long set, so the short ones no longer give what they give alone.
TEST(Packing, LongropePicksItsFactorsByTheLargestPosition) {
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> id(3, 250);
  std::vector<std::vector<int32_t>> docs;
  for (int n : {5, 1, 7, 4, 6, 8, 9}) {
    docs.emplace_back();
    for (int i = 0; i < n; i++) docs.back().push_back(id(rng));
  }
  for (const char* device : {"cpu", "cuda"}) {
    SCOPED_TRACE(device);
    const std::vector<std::vector<int32_t>> shorts(docs.begin(), docs.begin() + 6);
    const Result alone = run("phi3_longrope_tiny", device, DType::f32, shorts, {}, 13);
    const Result packed = run("phi3_longrope_tiny", device, DType::f32, shorts, {{0, 1, 2}, {3, 4}, {5}}, 13);
    EXPECT_NEAR(packed.loss, alone.loss, 1e-5 * std::fabs(alone.loss)) << "the loss sum, short set both ways";
    for (size_t u = 0; u < alone.grads.size(); u++)
      EXPECT_LT(llmt_test::rel_error(packed.grads[u].data(), alone.grads[u].data(), (int64_t)alone.grads[u].size()),
                1e-5) << "unit " << u << "'s gradient";
    const Result alone9 = run("phi3_longrope_tiny", device, DType::f32, docs, {}, 13);
    const Result packed9 = run("phi3_longrope_tiny", device, DType::f32, docs, {{0, 1, 2}, {3, 4}, {5}, {6}}, 13);
    // (4e-4 of the loss sum apart, 40 times the fp32 agreement asked above)
    EXPECT_GT(std::fabs(packed9.loss - alone9.loss), 1e-4 * std::fabs(alone9.loss)) << "the long set for all";
  }
}

// The LM head and loss in chunks of tokens (--logits_chunk_tokens: a logits buffer of that many
// rows, each chunk's logits recomputed in backward) give the whole batch's loss and gradients: only
// the order in which the head's weight gradient adds the rows differs. 39 tokens in chunks of 5
// (the last of 4) and 16.
TEST(HeadChunks, ChunkedHeadGivesTheWholeBatchsLossAndGradients) {
  std::mt19937 rng(12);
  std::uniform_int_distribution<int> id(3, 250);
  std::vector<std::vector<int32_t>> docs;
  for (int n : {13, 13, 13}) {
    docs.emplace_back();
    for (int i = 0; i < n; i++) docs.back().push_back(id(rng));
  }
  const std::vector<std::vector<int>> rows = {{0}, {1}, {2}};
  for (const char* fixture : {"gpt2_tiny", "llama_tiny"})
    for (const char* device : {"cpu", "cuda"})
      for (DType dt : {DType::f32, DType::bf16}) {
        const Result whole = run(fixture, device, dt, docs, rows, 13);
        for (int64_t chunk : {5, 16}) {
          SCOPED_TRACE(::testing::Message() << fixture << " " << device << " " << dtype_name(dt) << " chunk " << chunk);
          const Result part = run(fixture, device, dt, docs, rows, 13, chunk);
          EXPECT_NEAR(part.loss, whole.loss, 1e-6 * std::fabs(whole.loss)) << "the loss sum";
          for (size_t u = 0; u < whole.grads.size(); u++)
            EXPECT_LT(llmt_test::rel_error(part.grads[u].data(), whole.grads[u].data(), (int64_t)whole.grads[u].size()),
                      dt == DType::f32 ? 1e-5 : 1e-2)
                << "unit " << u << "'s gradient";
        }
      }
  // no pass keeps every row's logits
  const std::string dir = llmt_test::reference_dir() + "/llama_tiny";
  const ModelConfig cfg = config_from_json_file(dir + "/config.json");
  std::unique_ptr<Backend> be = make_cpu_backend(1, DType::f32);
  Transformer model(cfg, *be, 1, 8, false, 3);
  std::unique_ptr<DataComm> solo = make_solo_data_comm();
  FsdpStore store(*be, model.layout(), Strategy::no_shard, *solo, 1);
  const std::vector<int32_t> tok = {5, 6, 7, 8, 9, 10, 11, 12};
  llmt_test::expect_error([&] { model.forward(store, tok.data(), nullptr, 8, Tensor()); },
                          {"3 of the 8 tokens at a time", "--logits_chunk_tokens"});
  llmt_test::expect_error([&] { model.logits(); }, {"chunks of 3 tokens"});
}

TEST(Packing, DocumentsMustBeContiguous) {
  const std::string dir = llmt_test::reference_dir() + "/llama_tiny";
  const ModelConfig cfg = config_from_json_file(dir + "/config.json");
  std::unique_ptr<Backend> be = make_cpu_backend(1, DType::f32);
  Transformer model(cfg, *be, 1, 4);
  std::unique_ptr<DataComm> solo = make_solo_data_comm();
  FsdpStore store(*be, model.layout(), Strategy::no_shard, *solo, 1);
  const std::vector<int32_t> tok = {5, 6, 7, 8}, bad = {0, 0, 2, 1};
  llmt_test::expect_error([&] { model.forward(store, tok.data(), nullptr, 4, Tensor(), nullptr, bad.data()); },
                          {"token 3", "document start 1", "contiguous"});
}

}  // namespace
