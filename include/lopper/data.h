// Datasets for calibration, training and evaluation: one spec syntax everywhere.
//
//   fashion-mnist          Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist)
//   idx:DIR                MNIST-style IDX files in DIR
//                          ({train,t10k}-{images-idx3,labels-idx1}-ubyte, optionally .gz)
//   cifar10:DIR            CIFAR-10 binary batches (data_batch_1..5.bin, test_batch.bin)
//   folder:DIR             one subfolder per class (sorted names = labels), PNG/JPEG images; a
//                          split folder DIR/train or DIR/test is used when it exists. Images
//                          are gray or RGB as the first one is (alpha dropped); hidden files
//                          are skipped
//   npy:X.npy,Y.npy        samples [N, ...] (any numeric dtype) and integer labels [N]; the split
//                          is ignored (one pair of files is one split)
//   npy:NAME=F.npy,...     one file per model input, by the input's name (input_ids=ids.npy,
//                          attention_mask=mask.npy, ...), and labels=Y.npy when there are labels
//                          ([N] or [N, T]); all with the same N
//   tokens:IDS.npy[,...]   token IDs, integers [N, T], for language models; entries after the
//                          file: labels=Y.npy ([N] per sequence or [N, T] per token), mask=M.npy
//                          (the attention mask, [N, T]), pad=ID (the mask is ids != ID when no
//                          mask is given; else it is all ones), input=NAME (the model input the
//                          IDs go to; default input_ids when the model has it, else its first),
//                          and NAME=F.npy for any other input (token_type_ids=T.npy, ...)
//
// Image samples come out as float32 [B, C, H, W] (or [B, ...] for npy): pixels scaled to [0, 1]
// without mean/std (what a PyTorch model trained on ToTensor() expects) unless `normalize` is set.
// Integer samples other than uint8 pixels (token IDs, masks) come out as int64 and reach the
// model in its input's own dtype. A model input that the data does not give is derived when it
// can be: attention_mask (all ones), token_type_ids (zeros), position_ids (0, 1, ...).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lopper {

/// Tensors by model input name.
using NamedInputs = std::vector<std::pair<std::string, at::Tensor>>;

/// A dataset held or indexed in memory. get() may be called from a background thread.
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of samples.
  virtual int64_t size() const = 0;
  /// Shape of one sample as get() returns it (e.g. {1, 28, 28}, {3, 32, 32}).
  virtual std::vector<int64_t> sample_shape() const = 0;
  /// Number of classes (max label + 1 over the whole dataset, or the folder count; 0 without
  /// labels).
  virtual int64_t num_classes() const = 0;
  /// Samples `indices` as float32 [B, sample_shape...] (pixels in [0, 1]) or int64 (integer
  /// samples: token IDs), and int64 labels [B] (or [B, T]; undefined when the data has none).
  /// Throws lopper::Error naming the file for an image that does not decode.
  virtual void get(const std::vector<int64_t>& indices, at::Tensor& x, at::Tensor& y) const = 0;
  /// The further inputs of samples `indices`, by model input name (attention_mask, ...), and the
  /// model input the samples themselves go to ("" when any: the model's first input). None by
  /// default.
  virtual NamedInputs get_inputs(const std::vector<int64_t>& indices) const;
  virtual std::string sample_input() const { return ""; }
  /// Whether the samples are integers (token IDs): they are neither scaled nor normalized.
  virtual bool integer_samples() const { return false; }
  /// Whether every sample has a label.
  virtual bool has_labels() const { return true; }
  /// get() with every sample resized to h x w (bilinear, antialiased) before they are stacked, so
  /// that images of different sizes (a folder) can share a batch. The default resizes the batch.
  virtual void get_resized(const std::vector<int64_t>& indices, int64_t h, int64_t w, at::Tensor& x,
                           at::Tensor& y) const;
  /// The spec it was opened from, e.g. "fashion-mnist (train)".
  virtual std::string name() const = 0;
};

/// Opens a dataset spec (see the top of this file) with `split` "train" or "test". Throws
/// lopper::Error, one line naming the spec and the missing or malformed file, on any problem.
std::shared_ptr<Dataset> open_dataset(const std::string& spec, const std::string& split = "train");

struct LoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = true;
  uint64_t seed = 0;       // shuffling: the same seed gives the same order, epoch by epoch
  bool drop_last = false;  // drop a last batch smaller than batch_size
  /// Per-channel (dim 0 of a sample) mean and std, applied after scaling to [0, 1]: one value
  /// for all channels or one per channel. Empty: none.
  std::vector<double> mean, std;
  /// Resize images to H x W (bilinear, antialiased) when > 0.
  int64_t resize_h = 0, resize_w = 0;
  /// Data parallel: this process reads samples rank, rank + world, ... of each epoch's order.
  int rank = 0, world = 1;
  /// Batches prepared ahead on the background thread (at least 1 is); refilled in bursts once
  /// half of them are used.
  int prefetch = 8;
};

/// Parses "MEAN,STD" or "M1,M2,M3,S1,S2,S3" into o.mean/o.std and "HxW" into o.resize_h/w;
/// throws lopper::Error on anything else.
void parse_normalize(const std::string& s, LoaderOptions& o);
void parse_resize(const std::string& s, LoaderOptions& o);

struct Batch {
  at::Tensor x;         // float32 [B, ...], or int64 [B, T] token IDs
  at::Tensor y;         // int64 [B] or [B, T]; undefined when the data has no labels
  NamedInputs inputs;   // further model inputs by name (attention_mask, token_type_ids, ...)
  std::string x_input;  // the model input x goes to; "": the model's first (or input_ids)
  int64_t size() const { return x.size(0); }
};

/// Batches of a dataset, prepared on a background thread.
class DataLoader {
 public:
  DataLoader(std::shared_ptr<Dataset> data, LoaderOptions opts);
  /// A loader over batches already made (the Python package's calibration data, handed over as
  /// tensors): every epoch gives them as they are, in their order (no shuffling, sharding,
  /// normalization or background thread); they may differ in size and, past the batch dim, in
  /// shape (token batches padded each to its own length). Labels become int64. `name` names the
  /// data in messages. Throws lopper::Error when there is no batch, a batch has no samples, or
  /// its labels (integers) or named inputs do not have its batch size.
  DataLoader(std::vector<Batch> batches, std::string name);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// Starts epoch `epoch` (0, 1, ...): its order is a function of (seed, epoch) only. An epoch
  /// still running is stopped first.
  void start_epoch(int64_t epoch);
  /// The next batch of the current epoch (epoch 0 when none was started); false at its end.
  /// Rethrows the background thread's error (e.g. an image that does not decode), after the
  /// batches made before it.
  bool next(Batch& out);
  /// Batches per epoch for this rank.
  int64_t batches_per_epoch() const;
  /// Samples per epoch for this rank.
  int64_t samples_per_epoch() const;
  const Dataset& dataset() const;
  const LoaderOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Reshapes a batch [B, ...] to a model input's shape `dims` (-1 = dynamic; the first one is the
/// batch) when the per-sample element counts agree: a 784-input MLP and a 1x28x28 CNN both take
/// Fashion-MNIST. Throws lopper::Error naming `input` when they do not, or when the model's batch
/// dim is fixed and differs from B.
at::Tensor fit_to_input(const at::Tensor& x, const std::vector<int64_t>& dims,
                        const std::string& input);

}  // namespace lopper
