// Token-ID datasets (tokens:) and one file per model input (npy:NAME=F.npy,...).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/npy.h"
#include "test_util.h"

namespace lopper {
namespace {

using test::error_of;
using test::TempDir;

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

const at::Tensor* named(const NamedInputs& v, const std::string& name) {
  for (const auto& [n, t] : v)
    if (n == name) return &t;
  return nullptr;
}

TEST(DataTokens, IdsStayIntegersAndTheMaskComesFromPad) {
  TempDir dir;
  // int32 IDs with padding (0) at the end of row 1.
  at::Tensor ids = at::tensor({5, 6, 7, 8, 9, 4, 0, 0, 3, 2, 1, 7}, at::kInt).reshape({3, 4});
  save_npy(ids, dir / "ids.npy");
  auto d = open_dataset("tokens:" + (dir / "ids.npy") + ",pad=0");
  EXPECT_EQ(d->size(), 3);
  EXPECT_TRUE(d->integer_samples());
  EXPECT_FALSE(d->has_labels());
  EXPECT_EQ(d->sample_input(), "");  // input_ids when the model has it, else its first input
  at::Tensor x, y;
  d->get({1, 0}, x, y);
  EXPECT_EQ(x.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(x, ids.index_select(0, at::tensor({1, 0}, at::kLong)).to(at::kLong)));
  EXPECT_FALSE(y.defined());
  NamedInputs in = d->get_inputs({1, 0});
  ASSERT_EQ(in.size(), 1u);
  EXPECT_EQ(in[0].first, "attention_mask");
  EXPECT_TRUE(
      at::equal(in[0].second, at::tensor({1, 1, 0, 0, 1, 1, 1, 1}, at::kLong).reshape({2, 4})));
  // Without pad= or mask= there is no mask (the model's gets ones when it is fed).
  EXPECT_TRUE(open_dataset("tokens:" + (dir / "ids.npy"))->get_inputs({0}).empty());
}

TEST(DataTokens, LabelsMaskAndFurtherInputsByName) {
  TempDir dir;
  save_npy(at::arange(8, at::kLong).reshape({2, 4}), dir / "ids.npy");
  save_npy(at::tensor({1, 0, 1, 1, 1, 1, 0, 0}, at::kLong).reshape({2, 4}), dir / "mask.npy");
  save_npy(at::zeros({2, 4}, at::kLong), dir / "types.npy");
  save_npy(at::tensor({2, 0}, at::kLong), dir / "y.npy");
  save_npy(at::tensor({1, -100, 3, 4, 0, 0, -100, -100}, at::kLong).reshape({2, 4}),
           dir / "ytok.npy");
  auto d = open_dataset("tokens:" + (dir / "ids.npy") + ",mask=" + (dir / "mask.npy") +
                        ",token_type_ids=" + (dir / "types.npy") + ",labels=" + (dir / "y.npy") +
                        ",input=ids");
  EXPECT_EQ(d->sample_input(), "ids");
  EXPECT_EQ(d->num_classes(), 3);
  at::Tensor x, y;
  d->get({1}, x, y);
  EXPECT_EQ(y.item<int64_t>(), 0);
  NamedInputs in = d->get_inputs({1});
  ASSERT_TRUE(named(in, "attention_mask") && named(in, "token_type_ids"));
  EXPECT_TRUE(
      at::equal(*named(in, "attention_mask"), at::tensor({1, 1, 0, 0}, at::kLong).reshape({1, 4})));
  // Labels per token may hold -100 (not counted).
  auto t = open_dataset("tokens:" + (dir / "ids.npy") + ",labels=" + (dir / "ytok.npy"));
  t->get({0}, x, y);
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{1, 4}));
}

TEST(DataTokens, BadTokenDataIsOneLineErrorNamingIt) {
  TempDir dir;
  save_npy(at::arange(8, at::kLong).reshape({2, 4}), dir / "ids.npy");
  save_npy(at::rand({2, 4}), dir / "f.npy");
  save_npy(at::arange(8, at::kLong), dir / "flat.npy");
  save_npy(at::tensor({-1, 2}, at::kLong), dir / "neg.npy");
  save_npy(at::tensor({-5, 2, 1, 1, 1, 1, 1, 1}, at::kLong).reshape({2, 4}), dir / "negtok.npy");
  save_npy(at::tensor({1, 2, 3}, at::kLong), dir / "y3.npy");
  save_npy(at::ones({2, 3}, at::kLong), dir / "mask3.npy");
  const std::string ids = dir / "ids.npy";
  auto error = [&](const std::string& spec) {
    std::string e = error_of([&] { open_dataset(spec); });
    EXPECT_EQ(e.rfind("[data] ", 0), 0u) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    return e;
  };
  EXPECT_TRUE(has(error("tokens:" + (dir / "f.npy")), "must be integers [N, T], got Float"));
  EXPECT_TRUE(has(error("tokens:" + (dir / "flat.npy")), "must be integers [N, T], got Long [8]"));
  EXPECT_TRUE(has(error("tokens:" + (dir / "nope.npy")), "nope.npy': no such file"));
  EXPECT_TRUE(has(error("tokens:" + ids + ",pad=-1"), "pad must be a token ID"));
  EXPECT_TRUE(has(error("tokens:" + ids + ",pad=0,pad=1"), "'pad' is given twice"));
  EXPECT_TRUE(has(error("tokens:" + ids + ",labels=" + (dir / "y3.npy")), "has 3 labels"));
  EXPECT_TRUE(has(error("tokens:" + ids + ",labels=" + (dir / "neg.npy")), "label -1 at index 0"));
  EXPECT_TRUE(has(error("tokens:" + ids + ",labels=" + (dir / "negtok.npy")), "only -100"));
  EXPECT_TRUE(has(error("tokens:" + ids + ",mask=" + (dir / "mask3.npy")), "but the token IDs"));
  EXPECT_TRUE(has(error("tokens:" + ids + ",mask=" + ids + ",pad=0"), "both mask= and pad="));
  EXPECT_TRUE(has(error("tokens:" + ids + "," + ids), "has no name"));
  EXPECT_TRUE(has(error("tokens:"), "expected tokens:IDS.npy"));
}

TEST(DataNpyNamed, OneFilePerInputByName) {
  TempDir dir;
  save_npy(at::arange(12, at::kInt).reshape({3, 4}), dir / "ids.npy");
  save_npy(at::ones({3, 4}, at::kByte), dir / "mask.npy");
  save_npy(at::rand({3, 2}), dir / "extra.npy");
  save_npy(at::tensor({0, 1, 1}, at::kLong), dir / "y.npy");
  auto d =
      open_dataset("npy:input_ids=" + (dir / "ids.npy") + ",attention_mask=" + (dir / "mask.npy") +
                   ",extra=" + (dir / "extra.npy") + ",labels=" + (dir / "y.npy"));
  EXPECT_EQ(d->sample_input(), "input_ids");
  EXPECT_TRUE(d->integer_samples());
  at::Tensor x, y;
  d->get({2}, x, y);
  EXPECT_EQ(x.scalar_type(), at::kLong);
  EXPECT_EQ(y.item<int64_t>(), 1);
  NamedInputs in = d->get_inputs({2});
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(named(in, "attention_mask")->scalar_type(), at::kLong);  // integers: int64
  EXPECT_EQ(named(in, "extra")->scalar_type(), at::kFloat);          // floats: as they are
  // Without labels (a language model).
  EXPECT_FALSE(open_dataset("npy:input_ids=" + (dir / "ids.npy"))->has_labels());
  std::string e =
      error_of([&] { open_dataset("npy:a=" + (dir / "ids.npy") + "," + (dir / "y.npy")); });
  EXPECT_TRUE(has(e, "has no name")) << e;
  save_npy(at::ones({2, 4}, at::kLong), dir / "short.npy");
  e = error_of([&] { open_dataset("npy:a=" + (dir / "ids.npy") + ",b=" + (dir / "short.npy")); });
  EXPECT_TRUE(has(e, "has 2 samples, but")) << e;
  e = error_of([&] { open_dataset("npy:labels=" + (dir / "y.npy")); });
  EXPECT_TRUE(has(e, "names no model input")) << e;
}

TEST(DataLoader, TokenBatchesCarryTheirInputs) {
  TempDir dir;
  save_npy(at::arange(40, at::kLong).reshape({10, 4}), dir / "ids.npy");
  auto d = open_dataset("tokens:" + (dir / "ids.npy") + ",pad=3");
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.shuffle = false;
  DataLoader loader(d, lo);
  Batch b;
  ASSERT_TRUE(loader.next(b));
  EXPECT_EQ(b.x.scalar_type(), at::kLong);
  EXPECT_EQ(b.size(), 4);
  ASSERT_EQ(b.inputs.size(), 1u);
  EXPECT_EQ(b.inputs[0].second.sum().item<int64_t>(), 15);  // token 3 is padding
  LoaderOptions norm = lo;
  parse_normalize("0.5,0.5", norm);
  std::string e = error_of([&] { DataLoader l(d, norm); });
  EXPECT_TRUE(has(e, "normalize is for pixels and float samples")) << e;
}

}  // namespace
}  // namespace lopper
