// DataLoader (epoch order, sharding, one background thread), option parsing and fit_to_input.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/ParallelGuard.h>

// libgomp, which libtorch loads; weak, so that a libtorch without OpenMP still links.
extern "C" void omp_set_num_threads(int) __attribute__((weak));
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>

#include "data/images.h"
#include "lopper/data.h"
#include "lopper/error.h"
#include "util/random.h"

namespace lopper {
namespace {

constexpr int64_t kMaxResize = 1 << 15;

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

// The whole of `s` (spaces around it aside) as a finite number; from_chars, unlike strtod, does
// not depend on the locale.
bool parse_number(const std::string& s, double& v) {
  size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  if (b == std::string::npos) return false;
  const char *first = s.data() + b, *last = s.data() + e + 1;
  auto [end, ec] = std::from_chars(first, last, v);
  return ec == std::errc() && end == last && std::isfinite(v);
}

bool parse_size(const std::string& s, int64_t& v) {
  if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos)
    return false;
  v = std::stoll(s);
  return v >= 1 && v <= kMaxResize;
}

// NOTE: ATen's CPU generator seeds its Mersenne Twister with the low 32 bits of the seed only;
// splitmix64 folds all of (seed, epoch) into those bits, so that nearby seeds and epochs do not
// collide.
uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  return splitmix64(seed + uint64_t(epoch) * 0x9E3779B97F4A7C15ULL + 0x9E3779B97F4A7C15ULL);
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) os << ", ";
    if (dims[i] < 0)
      os << "?";
    else
      os << dims[i];
  }
  os << "]";
  return os.str();
}

// The samples of batches already made (DataLoader(batches, name)), as a Dataset: sample i is row
// i of the batches laid end to end. The loader hands the batches out whole; get() serves whoever
// reads samples through dataset().
class BatchesDataset : public Dataset {
 public:
  BatchesDataset(const std::vector<Batch>& batches, std::string name)
      : batches_(batches), name_(std::move(name)) {
    for (const Batch& b : batches_) {
      starts_.push_back(size_);
      size_ += b.size();
      labels_ = labels_ && b.y.defined();
      if (b.y.defined() && b.y.numel() > 0)
        classes_ = std::max(classes_, b.y.max().item<int64_t>() + 1);
    }
  }
  int64_t size() const override { return size_; }
  std::vector<int64_t> sample_shape() const override {
    return batches_.front().x.sizes().slice(1).vec();
  }
  int64_t num_classes() const override { return labels_ ? classes_ : 0; }
  std::string name() const override { return name_; }
  std::string sample_input() const override { return batches_.front().x_input; }
  bool integer_samples() const override { return !batches_.front().x.is_floating_point(); }
  bool has_labels() const override { return labels_; }

  void get(const std::vector<int64_t>& indices, at::Tensor& x, at::Tensor& y) const override {
    std::vector<at::Tensor> xs, ys;
    for (int64_t i : indices) {
      const auto [b, row] = locate(i);
      xs.push_back(batches_[b].x[row]);
      if (labels_) ys.push_back(batches_[b].y[row]);
    }
    x = stack(xs, "samples");
    y = labels_ ? stack(ys, "labels") : at::Tensor();
  }
  NamedInputs get_inputs(const std::vector<int64_t>& indices) const override {
    NamedInputs out;
    for (const auto& [name, t] : batches_.front().inputs) {
      std::vector<at::Tensor> rows;
      for (int64_t i : indices) {
        const auto [b, row] = locate(i);
        const at::Tensor* in = nullptr;
        for (const auto& [n, v] : batches_[b].inputs)
          if (n == name) in = &v;
        LOPPER_CHECK(in, "[data] ", name_, ": batch ", b, " has no input '", name, "'");
        rows.push_back((*in)[row]);
      }
      out.emplace_back(name, stack(rows, "input '" + name + "'"));
    }
    return out;
  }

 private:
  std::pair<size_t, int64_t> locate(int64_t i) const {
    LOPPER_CHECK(i >= 0 && i < size_, "[data] ", name_, ": sample ", i, " is out of range [0, ",
                 size_, ")");
    size_t b = size_t(std::upper_bound(starts_.begin(), starts_.end(), i) - starts_.begin()) - 1;
    return {b, i - starts_[b]};
  }
  at::Tensor stack(const std::vector<at::Tensor>& rows, const std::string& what) const {
    for (const auto& r : rows)
      LOPPER_CHECK(r.sizes() == rows.front().sizes(), "[data] ", name_, ": ", what, " of shapes ",
                   rows.front().sizes(), " and ", r.sizes(), " cannot share a batch");
    return at::stack(rows);
  }

  const std::vector<Batch>& batches_;  // the loader's, which outlives its dataset() reference
  std::string name_;
  std::vector<int64_t> starts_;
  int64_t size_ = 0, classes_ = 0;
  bool labels_ = true;
};

}  // namespace

void parse_normalize(const std::string& s, LoaderOptions& o) {
  std::vector<double> v;
  for (const std::string& part : split_commas(s)) {
    double d = 0;
    LOPPER_CHECK(parse_number(part, d), "[data] normalize: '", part, "' in '", s,
                 "' is not a number");
    v.push_back(d);
  }
  LOPPER_CHECK(v.size() % 2 == 0,
               "[data] normalize must be MEAN,STD or one mean per channel then "
               "one std per channel (M1,M2,M3,S1,S2,S3), got '",
               s, "'");
  size_t k = v.size() / 2;
  for (size_t i = k; i < v.size(); ++i)
    LOPPER_CHECK(v[i] > 0, "[data] normalize: std must be > 0, got ", v[i], " in '", s, "'");
  o.mean.assign(v.begin(), v.begin() + k);
  o.std.assign(v.begin() + k, v.end());
}

void parse_resize(const std::string& s, LoaderOptions& o) {
  size_t x = s.find('x');
  int64_t h = 0, w = 0;
  LOPPER_CHECK(
      x != std::string::npos && parse_size(s.substr(0, x), h) && parse_size(s.substr(x + 1), w),
      "[data] resize must be HxW with sizes in 1..", kMaxResize, " (e.g. 224x224), got '", s, "'");
  o.resize_h = h, o.resize_w = w;
}

struct DataLoader::Impl {
  std::shared_ptr<Dataset> data;
  LoaderOptions opts;
  at::Tensor mean, std;  // shaped to broadcast over [B, sample...]; undefined without normalize
  int64_t per_rank = 0;
  std::vector<int64_t> indices;  // this rank's samples of the current epoch, in order

  std::thread worker;
  std::mutex mu;
  std::condition_variable space, ready;  // the queue has room / a batch or the end is there
  std::deque<Batch> queue;
  std::exception_ptr error;
  bool stop = false, done = false, started = false;
  // DataLoader(batches, name): the batches, handed out in order by next(); no worker.
  std::vector<Batch> given;
  bool fixed = false;
  size_t next_given = 0;

  ~Impl() { stop_worker(); }

  int64_t batches() const {
    if (fixed) return int64_t(given.size());
    int64_t b = opts.batch_size;
    return opts.drop_last ? per_rank / b : (per_rank + b - 1) / b;
  }

  void stop_worker() {
    if (!worker.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    space.notify_all();
    worker.join();
  }

  Batch make_batch(int64_t b) const {
    int64_t begin = b * opts.batch_size;
    int64_t end = std::min(per_rank, begin + opts.batch_size);
    std::vector<int64_t> idx(indices.begin() + begin, indices.begin() + end);
    Batch out;
    if (opts.resize_h > 0)
      data->get_resized(idx, opts.resize_h, opts.resize_w, out.x, out.y);
    else
      data->get(idx, out.x, out.y);
    out.inputs = data->get_inputs(idx);
    out.x_input = data->sample_input();
    if (mean.defined()) out.x.sub_(mean).div_(std);
    return out;
  }

  // The background thread: makes the epoch's batches in order, at most `prefetch` ahead.
  void produce() {
    // NOTE: batches are small; ATen ops here run serially, so this thread never starts an OpenMP
    // team of its own: more OpenMP threads than cores make libgomp stop spinning between parallel
    // regions, and the training threads would sleep and wake at every step. ATen's OpenMP regions
    // size their team from this thread's own ICV.
    // ATen sets a thread's OpenMP team size on its first parallel op (init_num_threads): do that
    // first, then shrink it.
    at::init_num_threads();
    if (omp_set_num_threads) omp_set_num_threads(1);
    c10::ParallelGuard serial(true);
    const size_t capacity = size_t(std::max(1, opts.prefetch));
    for (int64_t b = 0, n = batches(); b < n; ++b) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stop) return;
      }
      Batch batch;
      try {
        batch = make_batch(b);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        error = std::current_exception();
        done = true;
        ready.notify_all();
        return;
      }
      std::unique_lock<std::mutex> lock(mu);
      // NOTE: once the queue is full, wait until it is half empty and refill it in one burst: a
      // wake-up per batch would take a core from the training threads at every step.
      if (queue.size() >= capacity)
        space.wait(lock, [&] { return stop || queue.size() <= capacity / 2; });
      if (stop) return;
      queue.push_back(std::move(batch));
      ready.notify_all();
    }
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    ready.notify_all();
  }
};

DataLoader::DataLoader(std::shared_ptr<Dataset> data, LoaderOptions opts)
    : impl_(std::make_unique<Impl>()) {
  LOPPER_CHECK(data, "[data] the loader has no dataset");
  const std::string name = data->name();
  LOPPER_CHECK(opts.batch_size >= 1, "[data] batch size must be >= 1, got ", opts.batch_size);
  LOPPER_CHECK(opts.world >= 1 && opts.rank >= 0 && opts.rank < opts.world,
               "[data] rank must be in [0, world), got rank ", opts.rank, " of world ", opts.world);
  std::vector<int64_t> shape = data->sample_shape();
  bool resize = opts.resize_h != 0 || opts.resize_w != 0;
  if (resize) {
    LOPPER_CHECK(opts.resize_h >= 1 && opts.resize_w >= 1 && opts.resize_h <= kMaxResize &&
                     opts.resize_w <= kMaxResize,
                 "[data] resize must be HxW with sizes in 1..", kMaxResize, ", got ", opts.resize_h,
                 "x", opts.resize_w);
    LOPPER_CHECK(shape.size() == 3, "[data] ", name, ": resize needs image samples [C, H, W], got ",
                 at::IntArrayRef(shape));
  }
  LOPPER_CHECK(opts.mean.empty() == opts.std.empty(),
               "[data] normalize needs both a mean and a std, got ", opts.mean.size(),
               " means and ", opts.std.size(), " stds");
  LOPPER_CHECK(opts.mean.empty() || !data->integer_samples(), "[data] ", name,
               ": normalize is for pixels and float samples; these are integers");
  LOPPER_CHECK(!resize || !data->integer_samples(), "[data] ", name,
               ": resize is for images; these samples are integers");
  if (!opts.mean.empty()) {
    int64_t channels = shape.empty() ? 1 : shape[0];
    for (const auto* v : {&opts.mean, &opts.std})
      LOPPER_CHECK(v->size() == 1 || int64_t(v->size()) == channels, "[data] ", name,
                   ": normalize has ", v->size(), v == &opts.mean ? " means" : " stds",
                   ", but the samples have ", channels, " channels (give 1 or ", channels, ")");
    for (double s : opts.std)
      LOPPER_CHECK(s > 0 && std::isfinite(s), "[data] normalize: std must be > 0, got ", s);
    // [C] -> [C, 1, 1, ...] so that it broadcasts over [B, C, ...].
    std::vector<int64_t> view(shape.size(), 1);
    auto as_tensor = [&](const std::vector<double>& v) {
      at::Tensor t = at::tensor(at::ArrayRef<double>(v), at::kDouble).to(at::kFloat);
      if (v.size() == 1) return t.reshape({});
      view[0] = int64_t(v.size());
      return t.reshape(view);
    };
    impl_->mean = as_tensor(opts.mean);
    impl_->std = as_tensor(opts.std);
  }
  // Every rank gets floor(N / world) samples: the same number of steps on every rank.
  impl_->per_rank = data->size() / opts.world;
  LOPPER_CHECK(impl_->per_rank >= 1, "[data] ", name, ": ", data->size(),
               " samples cannot be shared by ", opts.world, " ranks");
  impl_->data = std::move(data);
  impl_->opts = std::move(opts);
}

DataLoader::DataLoader(std::vector<Batch> batches, std::string name)
    : impl_(std::make_unique<Impl>()) {
  LOPPER_CHECK(!batches.empty(), "[data] ", name, " has no batch");
  for (size_t i = 0; i < batches.size(); ++i) {
    Batch& b = batches[i];
    LOPPER_CHECK(b.x.defined() && b.x.dim() >= 1 && b.x.size(0) >= 1, "[data] ", name, ": batch ",
                 i, " has no samples (a tensor [B, ...] with B >= 1)");
    const int64_t n = b.x.size(0);
    if (b.y.defined()) {
      LOPPER_CHECK(
          !b.y.is_floating_point() && !b.y.is_complex() && b.y.dim() >= 1 && b.y.size(0) == n,
          "[data] ", name, ": batch ", i, " has ", n, " samples, so its labels must be integers [",
          n, "] or [", n, ", T], got ", c10::toString(b.y.scalar_type()), " ", b.y.sizes());
      b.y = b.y.to(at::kLong);
    }
    for (const auto& [input, t] : b.inputs)
      LOPPER_CHECK(t.defined() && t.dim() >= 1 && t.size(0) == n, "[data] ", name, ": batch ", i,
                   " has ", n, " samples, but its input '", input, "' is ",
                   t.defined() ? t.sizes() : at::IntArrayRef{});
  }
  impl_->fixed = true;
  impl_->given = std::move(batches);
  impl_->data = std::make_shared<BatchesDataset>(impl_->given, std::move(name));
  impl_->per_rank = impl_->data->size();
  impl_->opts.batch_size = impl_->given.front().size();
  impl_->opts.shuffle = false;
  impl_->opts.prefetch = 0;
}

DataLoader::~DataLoader() = default;

void DataLoader::start_epoch(int64_t epoch) {
  LOPPER_CHECK(epoch >= 0, "[data] epoch must be >= 0, got ", epoch);
  Impl& m = *impl_;
  if (m.fixed) {
    m.next_given = 0;
    m.started = true;
    return;
  }
  m.stop_worker();
  const LoaderOptions& o = m.opts;
  int64_t n = m.data->size();
  at::Tensor order;
  if (o.shuffle) {
    at::Generator gen = at::detail::createCPUGenerator(epoch_seed(o.seed, epoch));
    order = at::randperm(n, gen, at::kLong);
  } else {
    order = at::arange(n, at::kLong);
  }
  // Rank r takes positions r, r + world, ... of the order; the tail that would leave the ranks
  // unequal is dropped.
  const int64_t* p = order.const_data_ptr<int64_t>();
  m.indices.resize(m.per_rank);
  for (int64_t k = 0; k < m.per_rank; ++k) m.indices[k] = p[o.rank + k * o.world];
  m.queue.clear();
  m.error = nullptr;
  m.stop = m.done = false;
  m.started = true;
  m.worker = std::thread([&m] { m.produce(); });
}

bool DataLoader::next(Batch& out) {
  Impl& m = *impl_;
  if (!m.started) start_epoch(0);
  if (m.fixed) {
    if (m.next_given >= m.given.size()) return false;
    out = m.given[m.next_given++];
    return true;
  }
  std::unique_lock<std::mutex> lock(m.mu);
  m.ready.wait(lock, [&] { return !m.queue.empty() || m.done; });
  if (!m.queue.empty()) {
    out = std::move(m.queue.front());
    m.queue.pop_front();
    if (m.queue.size() <= size_t(std::max(1, m.opts.prefetch)) / 2) m.space.notify_all();
    return true;
  }
  if (m.error) {
    std::exception_ptr e = m.error;
    m.error = nullptr;  // the epoch ends with it: later calls return false
    std::rethrow_exception(e);
  }
  return false;
}

int64_t DataLoader::batches_per_epoch() const { return impl_->batches(); }
int64_t DataLoader::samples_per_epoch() const {
  if (impl_->fixed) return impl_->per_rank;
  return impl_->opts.drop_last ? impl_->batches() * impl_->opts.batch_size : impl_->per_rank;
}
const Dataset& DataLoader::dataset() const { return *impl_->data; }
const LoaderOptions& DataLoader::options() const { return impl_->opts; }

at::Tensor fit_to_input(const at::Tensor& x, const std::vector<int64_t>& dims,
                        const std::string& input) {
  LOPPER_CHECK(x.defined() && x.dim() >= 1, "[data] input '", input, "': no batch to fit");
  LOPPER_CHECK(!dims.empty(), "[data] input '", input,
               "' is a scalar; it cannot take a batch of samples ", x.sizes());
  const int64_t batch = x.size(0);
  LOPPER_CHECK(dims[0] < 0 || dims[0] == batch, "[data] input '", input,
               "' has a fixed batch size of ", dims[0], ", but the batch has ", batch,
               " samples (use a batch size of ", dims[0], ")");
  std::vector<int64_t> sample = x.sizes().slice(1).vec();
  std::vector<int64_t> want(dims.begin() + 1, dims.end());
  int64_t count = 1, known = 1, dynamic = 0;
  for (int64_t d : sample) count *= d;
  for (int64_t d : want) d < 0 ? ++dynamic : known *= d;
  std::vector<int64_t> target{batch};
  if (dynamic == 0 && known == count) {
    target.insert(target.end(), want.begin(), want.end());
    return x.reshape(target);
  }
  if (dynamic > 0 && want.size() == sample.size()) {
    // Same rank: the dynamic dims take the sample's sizes, the static ones must agree.
    bool same = true;
    for (size_t i = 0; i < want.size(); ++i) same = same && (want[i] < 0 || want[i] == sample[i]);
    if (same) return x;
  }
  if (dynamic == 1 && known > 0 && count % known == 0) {
    for (int64_t d : want) target.push_back(d < 0 ? count / known : d);
    return x.reshape(target);
  }
  std::string per_sample = dynamic ? "" : " (" + std::to_string(known) + " values per sample)";
  throw Error(detail::concat("[data] input '", input, "' takes ", dims_str(dims), per_sample,
                             ", but the samples are ", at::IntArrayRef(sample), " (", count,
                             " values)"));
}

}  // namespace lopper
