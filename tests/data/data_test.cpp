// Datasets (Fashion-MNIST, IDX, CIFAR-10, image folders, NPY), the loader and fit_to_input.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>
#include <png.h>

#include "lopper/data.h"
#include "lopper/error.h"
#include "lopper/npy.h"
#include "test_util.h"

namespace lopper {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::TempDir;

// An error message lopper's users see: one line, "[data] ...".
::testing::AssertionResult is_data_error(const std::string& msg) {
  if (msg.rfind("[data] ", 0) != 0)
    return ::testing::AssertionFailure() << "not a [data] error: '" << msg << "'";
  if (msg.find('\n') != std::string::npos)
    return ::testing::AssertionFailure() << "more than one line: '" << msg << "'";
  return ::testing::AssertionSuccess();
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// is_data_error(msg), and msg has each of `parts`.
::testing::AssertionResult is_data_error_with(const std::string& msg,
                                              std::initializer_list<std::string> parts) {
  if (auto r = is_data_error(msg); !r) return r;
  for (const std::string& part : parts)
    if (!has(msg, part))
      return ::testing::AssertionFailure() << "no '" << part << "' in '" << msg << "'";
  return ::testing::AssertionSuccess();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_TRUE(f);
  ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::string be32(uint32_t v) {
  return {char(v >> 24), char(v >> 16 & 0xff), char(v >> 8 & 0xff), char(v & 0xff)};
}

// IDX images [n, h, w] with pixel p = (7 * i + 3) % 256, and labels.
std::string idx_images(int n, int h, int w) {
  std::string s = be32(0x803) + be32(n) + be32(h) + be32(w);
  for (int i = 0; i < n * h * w; ++i) s += char((7 * i + 3) % 256);
  return s;
}
std::string idx_labels(const std::vector<int>& labels) {
  std::string s = be32(0x801) + be32(uint32_t(labels.size()));
  for (int l : labels) s += char(l);
  return s;
}

// uint8 HWC pixels as the loader gives them: float CHW in [0, 1].
at::Tensor chw(const std::vector<uint8_t>& px, int64_t h, int64_t w, int64_t c) {
  return at::from_blob(const_cast<uint8_t*>(px.data()), {h, w, c}, at::kByte)
      .permute({2, 0, 1})
      .to(at::kFloat)
      .div(255);
}

void write_png(const std::string& path, int w, int h, png_uint_32 format, const void* px,
               const void* colormap = nullptr, int entries = 0) {
  fs::create_directories(fs::path(path).parent_path());
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = w;
  img.height = h;
  img.format = format;
  img.colormap_entries = entries;
  ASSERT_TRUE(png_image_write_to_file(&img, path.c_str(), 0, px, 0, colormap)) << img.message;
}

void write_jpeg(const std::string& path, int w, int h, int c, const std::vector<uint8_t>& px) {
  fs::create_directories(fs::path(path).parent_path());
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_TRUE(f);
  jpeg_stdio_dest(&cinfo, f);
  cinfo.image_width = w;
  cinfo.image_height = h;
  cinfo.input_components = c;
  cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 95, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(&px[size_t(cinfo.next_scanline) * w * c]);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::fclose(f);
  jpeg_destroy_compress(&cinfo);
}

std::vector<uint8_t> solid(int h, int w, std::vector<uint8_t> color) {
  std::vector<uint8_t> px;
  for (int i = 0; i < h * w; ++i) px.insert(px.end(), color.begin(), color.end());
  return px;
}

// npy:X,Y with X[i] = i (float [n, 1]) and Y[i] = i: a batch's labels are its sample order.
std::string counting_npy(const TempDir& dir, int64_t n) {
  save_npy(at::arange(n, at::kFloat).reshape({n, 1}), dir / "x.npy");
  save_npy(at::arange(n, at::kLong), dir / "y.npy");
  return "npy:" + (dir / "x.npy") + "," + (dir / "y.npy");
}

std::vector<int64_t> longs(const at::Tensor& t) {
  at::Tensor c = t.to(at::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// The labels of one epoch, batch after batch.
std::vector<int64_t> epoch_labels(DataLoader& loader, int64_t epoch,
                                  std::vector<int64_t>* batch_sizes = nullptr) {
  loader.start_epoch(epoch);
  std::vector<int64_t> out;
  Batch b;
  while (loader.next(b)) {
    EXPECT_TRUE(at::equal(b.x.flatten(), b.y.to(at::kFloat)));  // the sample matches its label
    if (batch_sizes) batch_sizes->push_back(b.y.size(0));
    for (int64_t i = 0; i < b.y.size(0); ++i) out.push_back(b.y[i].item<int64_t>());
  }
  return out;
}

// --- Fashion-MNIST (Debian's real files) ---------------------------------------------------------

TEST(DataFashionMnist, TrainAndTestSplits) {
  auto train = open_dataset("fashion-mnist", "train");
  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(train->sample_shape(), (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(train->num_classes(), 10);
  EXPECT_EQ(train->name(), "fashion-mnist (train)");
  at::Tensor x, y;
  train->get({0, 1, 59999}, x, y);
  ASSERT_EQ(x.sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
  EXPECT_EQ(x.scalar_type(), at::kFloat);
  EXPECT_EQ(y.scalar_type(), at::kLong);
  EXPECT_EQ(y[0].item<int64_t>(), 9);  // the first training image is an ankle boot
  EXPECT_EQ(y[1].item<int64_t>(), 0);  // then a T-shirt
  // The first image's bytes, summed (read independently with Python's gzip).
  EXPECT_EQ(x[0].mul(255).round().sum().item<double>(), 76247);
  EXPECT_GE(x.min().item<float>(), 0.f);
  EXPECT_EQ(x[0].max().item<float>(), 1.f);

  auto test = open_dataset("fashion-mnist", "test");
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(test->name(), "fashion-mnist (test)");
  test->get({0, 1, 2}, x, y);
  EXPECT_EQ(longs(y), (std::vector<int64_t>{9, 2, 1}));
}

TEST(DataFashionMnist, LoaderReadsTheBalancedTestSetOnce) {
  LoaderOptions o;
  o.batch_size = 999;  // not a divisor: a short last batch
  o.seed = 3;
  DataLoader loader(open_dataset("fashion-mnist", "test"), o);
  EXPECT_EQ(loader.batches_per_epoch(), 11);
  loader.start_epoch(0);
  Batch b;
  int64_t n = 0;
  at::Tensor per_class = at::zeros({10}, at::kLong);
  while (loader.next(b)) {
    EXPECT_EQ(b.x.sizes().slice(1), (std::vector<int64_t>{1, 28, 28}));
    n += b.x.size(0);
    per_class.index_add_(0, b.y, at::ones_like(b.y));
  }
  EXPECT_EQ(n, 10000);
  // Fashion-MNIST's test set holds 1000 images of each class.
  EXPECT_TRUE(at::equal(per_class, at::full({10}, 1000, at::kLong)));
}

// --- IDX -----------------------------------------------------------------------------------------

TEST(DataIdx, PlainAndGzipReadTheSame) {
  TempDir dir;
  const std::vector<int> labels{3, 1, 4, 1, 5};
  std::string images = idx_images(5, 3, 4);
  write_bytes(dir / "plain/train-images-idx3-ubyte", images);
  write_bytes(dir / "plain/train-labels-idx1-ubyte", idx_labels(labels));
  fs::create_directories(dir.path / "gz");
  write_gz(dir / "gz/train-images-idx3-ubyte.gz", images);
  write_gz(dir / "gz/train-labels-idx1-ubyte.gz", idx_labels(labels));
  write_gz(dir / "gz/t10k-images-idx3-ubyte.gz", idx_images(2, 3, 4));
  write_gz(dir / "gz/t10k-labels-idx1-ubyte.gz", idx_labels({0, 7}));

  std::vector<uint8_t> bytes(images.begin() + 16, images.end());
  at::Tensor want = at::from_blob(bytes.data(), {5, 1, 3, 4}, at::kByte).to(at::kFloat).div(255);
  for (const char* sub : {"plain", "gz"}) {
    auto d = open_dataset("idx:" + (dir / sub), "train");
    EXPECT_EQ(d->size(), 5);
    EXPECT_EQ(d->sample_shape(), (std::vector<int64_t>{1, 3, 4}));
    EXPECT_EQ(d->num_classes(), 6);
    at::Tensor x, y;
    d->get({4, 0, 2}, x, y);
    EXPECT_TRUE(at::equal(x, want.index_select(0, at::tensor({4, 0, 2}, at::kLong)))) << sub;
    EXPECT_EQ(longs(y), (std::vector<int64_t>{5, 3, 4})) << sub;
  }
  auto test = open_dataset("idx:" + (dir / "gz"), "test");
  EXPECT_EQ(test->size(), 2);
  EXPECT_EQ(test->num_classes(), 8);
  // The plain folder has no test split.
  EXPECT_TRUE(is_data_error_with(error_of([&] { open_dataset("idx:" + (dir / "plain"), "test"); }),
                                 {"t10k-images-idx3-ubyte", "no such file or directory"}));
}

TEST(DataIdx, CorruptFilesAreOneLineErrorsNamingTheFile) {
  TempDir dir;
  std::error_code ec;
  std::string images = idx_images(4, 2, 2), labels = idx_labels({0, 1, 2, 3});
  auto error_with = [&](const std::string& img, const std::string& lab, bool gz) {
    remove_tree(dir / "d", ec);
    fs::create_directories(dir.path / "d");
    if (gz) {
      write_gz(dir / "d/train-images-idx3-ubyte.gz", img);
      write_gz(dir / "d/train-labels-idx1-ubyte.gz", lab);
    } else {
      write_bytes(dir / "d/train-images-idx3-ubyte", img);
      write_bytes(dir / "d/train-labels-idx1-ubyte", lab);
    }
    return error_of([&] { open_dataset("idx:" + (dir / "d")); });
  };
  ASSERT_EQ(error_with(images, labels, false), "");  // the intact pair opens
  ASSERT_EQ(error_with(images, labels, true), "");

  EXPECT_TRUE(is_data_error_with(error_with(images.substr(0, images.size() - 3), labels, false),
                                 {"train-images-idx3-ubyte' is truncated", "4x2x2"}));
  EXPECT_TRUE(is_data_error_with(error_with(images, labels + "x", true),
                                 {"train-labels-idx1-ubyte.gz' has trailing bytes"}));
  EXPECT_TRUE(is_data_error_with(error_with(images.substr(0, 10), labels, false), {"too short"}));
  // A label file where the images should be:
  EXPECT_TRUE(
      is_data_error_with(error_with(labels, labels, false),
                         {"train-images-idx3-ubyte' is not an IDX image file", "0x00000801"}));
  EXPECT_TRUE(is_data_error_with(error_with(images, idx_labels({0, 1, 2}), false),
                                 {"has 4 images, but", "has 3 labels"}));

  // A gzip file cut short: zlib's stream ends early.
  write_gz(dir / "whole.gz", images);
  std::string gz = test::slurp(dir / "whole.gz");
  remove_tree(dir / "d", ec);
  write_bytes(dir / "d/train-images-idx3-ubyte.gz", gz.substr(0, gz.size() / 2));
  write_bytes(dir / "d/train-labels-idx1-ubyte", labels);
  EXPECT_TRUE(is_data_error_with(error_of([&] { open_dataset("idx:" + (dir / "d")); }),
                                 {"train-images-idx3-ubyte.gz"}));
}

// --- CIFAR-10 ------------------------------------------------------------------------------------

// A CIFAR-10 batch file: `n` records, record r with label labels[r] and pixel p = (r + p) % 251.
std::string cifar_batch(const std::vector<int>& labels) {
  std::string s;
  for (size_t r = 0; r < labels.size(); ++r) {
    s += char(labels[r]);
    for (int p = 0; p < 3072; ++p) s += char((int(r) * 31 + p) % 251);
  }
  return s;
}

TEST(DataCifar, ReadsBinaryBatches) {
  TempDir dir;
  const std::string bin = dir / "cifar-10-batches-bin";
  for (int b = 1; b <= 5; ++b)
    write_bytes(bin + "/data_batch_" + std::to_string(b) + ".bin", cifar_batch({b, 9 - b}));
  write_bytes(bin + "/test_batch.bin", cifar_batch({7, 8, 9}));

  // Both the archive's folder and its parent.
  for (const std::string& root : {dir.path.string(), bin}) {
    auto d = open_dataset("cifar10:" + root, "train");
    EXPECT_EQ(d->size(), 10);
    EXPECT_EQ(d->sample_shape(), (std::vector<int64_t>{3, 32, 32}));
    EXPECT_EQ(d->num_classes(), 9);
    at::Tensor x, y;
    d->get({0, 5, 9}, x, y);
    EXPECT_EQ(longs(y), (std::vector<int64_t>{1, 6, 4}));
    // Record 1 of data_batch_3 (sample 5), channel 2 (blue), row 3, column 4.
    int p = 2 * 1024 + 3 * 32 + 4;
    EXPECT_FLOAT_EQ(x[1][2][3][4].item<float>(), float((1 * 31 + p) % 251) / 255);
    EXPECT_FLOAT_EQ(x[0][0][0][0].item<float>(), 0.f);
  }
  auto test = open_dataset("cifar10:" + bin, "test");
  EXPECT_EQ(test->size(), 3);
  EXPECT_EQ(test->num_classes(), 10);

  write_bytes(bin + "/test_batch.bin", cifar_batch({7, 8}) + "x");
  EXPECT_TRUE(
      is_data_error_with(error_of([&] { open_dataset("cifar10:" + bin, "test"); }),
                         {"test_batch.bin' has 6147 bytes, not a whole number of 3073-byte"}));
  write_bytes(bin + "/test_batch.bin", cifar_batch({7, 10}));
  EXPECT_TRUE(is_data_error_with(error_of([&] { open_dataset("cifar10:" + bin, "test"); }),
                                 {"record 1 has label 10"}));
  fs::remove(bin + "/data_batch_3.bin");
  EXPECT_TRUE(
      is_data_error_with(error_of([&] { open_dataset("cifar10:" + dir.path.string(), "train"); }),
                         {"data_batch_3.bin': no such file or directory"}));
}

// --- Image folders -------------------------------------------------------------------------------

TEST(DataFolder, DecodesPngExactlyWithSortedClasses) {
  TempDir dir;
  const int h = 4, w = 5;
  std::vector<uint8_t> rgb, rgba, rgb_b;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 4; ++c) {
        uint8_t v = uint8_t(y * 50 + x * 10 + c * 3);
        if (c < 3) rgb.push_back(v), rgb_b.push_back(uint8_t(v + 1));
        rgba.push_back(c < 3 ? uint8_t(v + 1) : uint8_t(17 * x));  // alpha must not matter
      }
  // Palette: four colours, index (x + y) % 4.
  const uint8_t palette[12] = {0, 0, 0, 255, 0, 0, 10, 200, 30, 255, 255, 255};
  std::vector<uint8_t> indices, pal_rgb;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      indices.push_back(uint8_t((x + y) % 4));
      for (int c = 0; c < 3; ++c) pal_rgb.push_back(palette[3 * ((x + y) % 4) + c]);
    }
  // 16-bit: scaled to 8 bits with rounding, v * 255 / 65535.
  std::vector<uint16_t> deep;
  std::vector<uint8_t> deep8;
  for (int i = 0; i < h * w * 3; ++i) {
    deep.push_back(uint16_t(i * 1100 + 5));
    deep8.push_back(uint8_t(std::lround((i * 1100 + 5) / 257.0)));
  }
  const std::string root = dir / "imgs";
  write_png(root + "/train/cat/sub/d.png", w, h, PNG_FORMAT_LINEAR_RGB, deep.data());
  write_png(root + "/train/bee/c.PNG", w, h, PNG_FORMAT_RGB_COLORMAP, indices.data(), palette, 4);
  write_png(root + "/train/bee/b.png", w, h, PNG_FORMAT_RGBA, rgba.data());
  write_png(root + "/train/ant/a.png", w, h, PNG_FORMAT_RGB, rgb.data());
  write_bytes(root + "/train/cat/.hidden.png", "not an image");  // hidden: skipped
  write_bytes(root + "/train/cat/notes.txt", "not an image");    // not an image name: skipped
  write_png(root + "/test/ant/x.png", w, h, PNG_FORMAT_RGB, rgb.data());

  auto d = open_dataset("folder:" + root, "train");
  ASSERT_EQ(d->size(), 4);
  EXPECT_EQ(d->num_classes(), 3);
  EXPECT_EQ(d->sample_shape(), (std::vector<int64_t>{3, h, w}));
  EXPECT_EQ(d->name(), "folder:" + root + " (train)");
  at::Tensor x, y;
  d->get({0, 1, 2, 3}, x, y);
  EXPECT_EQ(longs(y), (std::vector<int64_t>{0, 1, 1, 2}));  // ant, bee, bee, cat
  EXPECT_TRUE(at::equal(x[0], chw(rgb, h, w, 3)));
  EXPECT_TRUE(at::equal(x[1], chw(rgb_b, h, w, 3)));  // RGBA: alpha dropped
  EXPECT_TRUE(at::equal(x[2], chw(pal_rgb, h, w, 3)));
  EXPECT_TRUE(at::equal(x[3], chw(deep8, h, w, 3)));

  auto test = open_dataset("folder:" + root, "test");
  EXPECT_EQ(test->size(), 1);
  EXPECT_EQ(test->num_classes(), 1);
  // A folder without split subfolders is itself the dataset.
  auto flat = open_dataset("folder:" + root + "/train", "test");
  EXPECT_EQ(flat->size(), 4);
}

TEST(DataFolder, ChannelsFollowTheFirstImage) {
  TempDir dir;
  std::vector<uint8_t> gray{0, 60, 120, 255}, ga{10, 0, 20, 99, 30, 255, 40, 7};
  std::vector<uint8_t> rgb{200, 100, 50, 0, 0, 255, 255, 255, 255, 1, 2, 3};
  write_png(dir / "g/a/gray.png", 2, 2, PNG_FORMAT_GRAY, gray.data());
  write_png(dir / "g/b/ga.png", 2, 2, PNG_FORMAT_GA, ga.data());
  write_png(dir / "g/c/rgb.png", 2, 2, PNG_FORMAT_RGB, rgb.data());
  auto g = open_dataset("folder:" + (dir / "g"));
  EXPECT_EQ(g->sample_shape(), (std::vector<int64_t>{1, 2, 2}));
  at::Tensor x, y;
  g->get({0, 1, 2}, x, y);
  EXPECT_TRUE(at::equal(x[0], chw(gray, 2, 2, 1)));
  EXPECT_TRUE(at::equal(x[1], chw({10, 20, 30, 40}, 2, 2, 1)));  // gray + alpha: alpha dropped
  // RGB into a gray dataset: PIL's convert("L"), (R*19595 + G*38470 + B*7471 + 32768) >> 16.
  EXPECT_TRUE(at::equal(x[2], chw({124, 29, 255, 2}, 2, 2, 1)));

  write_png(dir / "c/a/rgb.png", 2, 2, PNG_FORMAT_RGB, rgb.data());
  write_png(dir / "c/b/gray.png", 2, 2, PNG_FORMAT_GRAY, gray.data());
  // A palette with transparency (tRNS): its alpha is dropped too.
  const uint8_t rgba_palette[8] = {9, 8, 7, 0, 250, 140, 30, 128};
  std::vector<uint8_t> indices{0, 1, 1, 0};
  write_png(dir / "c/c/pal.png", 2, 2, PNG_FORMAT_RGBA_COLORMAP, indices.data(), rgba_palette, 2);
  auto c = open_dataset("folder:" + (dir / "c"));
  EXPECT_EQ(c->sample_shape(), (std::vector<int64_t>{3, 2, 2}));
  c->get({1, 2}, x, y);
  EXPECT_TRUE(at::equal(x[0], chw(gray, 2, 2, 1).expand({3, 2, 2})));  // gray repeated
  EXPECT_TRUE(at::equal(x[1], chw({9, 8, 7, 250, 140, 30, 250, 140, 30, 9, 8, 7}, 2, 2, 3)));
}

TEST(DataFolder, DecodesJpegWithinTolerance) {
  TempDir dir;
  // Flat colours over whole 16x16 blocks survive JPEG (and its chroma subsampling) almost exactly.
  std::vector<uint8_t> red = solid(16, 16, {220, 40, 90}), gray;
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x) gray.push_back(uint8_t(x < 8 ? 30 : 200));
  write_jpeg(dir / "j/a/red.jpg", 16, 16, 3, red);
  write_jpeg(dir / "j/b/blue.JPEG", 16, 16, 3, solid(16, 16, {0, 10, 250}));
  write_jpeg(dir / "g/a/gray.jpeg", 16, 16, 1, gray);
  auto d = open_dataset("folder:" + (dir / "j"));
  ASSERT_EQ(d->size(), 2);
  at::Tensor x, y;
  d->get({0, 1}, x, y);
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{2, 3, 16, 16}));
  EXPECT_LT((x[0] - chw(red, 16, 16, 3)).abs().max().item<float>(), 3.f / 255);
  EXPECT_LT((x[1] - chw(solid(16, 16, {0, 10, 250}), 16, 16, 3)).abs().max().item<float>(),
            3.f / 255);
  auto g = open_dataset("folder:" + (dir / "g"));
  EXPECT_EQ(g->sample_shape(), (std::vector<int64_t>{1, 16, 16}));
  g->get({0}, x, y);
  // Ringing at the sharp edge, exact-ish away from it.
  EXPECT_LT((x[0] - chw(gray, 16, 16, 1)).abs().mean().item<float>(), 2.f / 255);
  EXPECT_NEAR(x[0][0][0][0].item<float>(), 30.f / 255, 3.f / 255);

  // A JPEG cut short is an error, in its headers or in its pixels (where libjpeg would only
  // warn and pad the image with gray).
  std::string bytes = test::slurp(dir / "j/a/red.jpg");
  write_bytes(dir / "j/a/red.jpg", bytes.substr(0, bytes.size() / 3));
  EXPECT_TRUE(is_data_error_with(error_of([&] { d->get({0}, x, y); }), {"red.jpg': bad JPEG"}));
  at::Tensor noise = at::randint(0, 256, {64 * 64 * 3}, at::kByte);
  write_jpeg(
      dir / "n/a/noise.jpg", 64, 64, 3,
      std::vector<uint8_t>(noise.data_ptr<uint8_t>(), noise.data_ptr<uint8_t>() + noise.numel()));
  auto n = open_dataset("folder:" + (dir / "n"));
  bytes = test::slurp(dir / "n/a/noise.jpg");
  write_bytes(dir / "n/a/noise.jpg", bytes.substr(0, bytes.size() * 2 / 3));
  EXPECT_TRUE(is_data_error_with(error_of([&] { n->get({0}, x, y); }),
                                 {"noise.jpg': bad JPEG: the file is truncated"}));
}

TEST(DataFolder, SizesMustAgreeUnlessResized) {
  TempDir dir;
  write_png(dir / "f/a/small.png", 5, 4, PNG_FORMAT_RGB, solid(4, 5, {255, 0, 51}).data());
  write_png(dir / "f/b/large.png", 7, 6, PNG_FORMAT_RGB, solid(6, 7, {0, 102, 255}).data());
  auto d = open_dataset("folder:" + (dir / "f"));
  EXPECT_EQ(d->sample_shape(), (std::vector<int64_t>{3, 4, 5}));
  at::Tensor x, y;
  const std::string e = error_of([&] { d->get({0, 1}, x, y); });
  EXPECT_TRUE(is_data_error_with(e, {"large.png' is 6x7, but", "small.png' is 4x5"}));

  LoaderOptions o;
  o.shuffle = false;
  o.resize_h = 3, o.resize_w = 8;
  DataLoader loader(d, o);
  Batch b;
  ASSERT_TRUE(loader.next(b));
  ASSERT_EQ(b.x.sizes(), (std::vector<int64_t>{2, 3, 3, 8}));
  // A flat image stays flat through the (normalised) filter.
  EXPECT_NEAR((b.x[0][0] - 1.f).abs().max().item<float>(), 0.f, 1e-6);
  EXPECT_NEAR((b.x[1][1] - 0.4f).abs().max().item<float>(), 0.f, 1e-6);
  EXPECT_FALSE(loader.next(b));
}

TEST(DataFolder, BadFoldersAreOneLineErrors) {
  TempDir dir;
  fs::create_directories(dir.path / "empty");
  EXPECT_TRUE(is_data_error_with(error_of([&] { open_dataset("folder:" + (dir / "empty")); }),
                                 {"has no class subfolders"}));

  write_bytes(dir / "noimg/a/readme.txt", "x");
  EXPECT_TRUE(is_data_error_with(error_of([&] { open_dataset("folder:" + (dir / "noimg")); }),
                                 {"holds no .png/.jpg/.jpeg images"}));

  // A split folder without the split asked for.
  write_png(dir / "split/train/a/x.png", 1, 1, PNG_FORMAT_GRAY, std::vector<uint8_t>{1}.data());
  EXPECT_TRUE(
      is_data_error_with(error_of([&] { open_dataset("folder:" + (dir / "split"), "test"); }),
                         {"split/test': no such file or directory"}));

  // The first image decides the sample shape, so it must decode when the folder opens.
  write_bytes(dir / "bad/a/x.png", "\x89PNG\r\n\x1a\n garbage");
  EXPECT_TRUE(is_data_error_with(error_of([&] { open_dataset("folder:" + (dir / "bad")); }),
                                 {"x.png': bad PNG"}));
  write_bytes(dir / "bad/a/x.png", "GIF89a");
  std::string e = error_of([&] { open_dataset("folder:" + (dir / "bad")); });
  EXPECT_TRUE(has(e, "x.png': not a PNG or JPEG image")) << e;
}

// --- NPY -----------------------------------------------------------------------------------------

TEST(DataNpy, SamplesAndLabels) {
  TempDir dir;
  at::Tensor pixels = at::arange(4 * 2 * 3, at::kByte).reshape({4, 2, 3}).mul(10);
  at::Tensor labels = at::tensor({2, 0, 1, 2}, at::kInt);
  save_npy(pixels, dir / "u8.npy");
  save_npy(labels, dir / "y.npy");
  std::string spec = "npy:" + (dir / "u8.npy") + "," + (dir / "y.npy");
  // The split is ignored: one pair of files is one split.
  for (const char* split : {"train", "test"}) {
    auto d = open_dataset(spec, split);
    EXPECT_EQ(d->size(), 4);
    EXPECT_EQ(d->sample_shape(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(d->num_classes(), 3);
    at::Tensor x, y;
    d->get({3, 1}, x, y);
    EXPECT_TRUE(at::equal(
        x, pixels.index_select(0, at::tensor({3, 1}, at::kLong)).to(at::kFloat).div(255)));
    EXPECT_EQ(longs(y), (std::vector<int64_t>{2, 0}));
  }
  // Other dtypes are converted, not scaled.
  at::Tensor f64 = at::linspace(-3, 3, 20, at::kDouble).reshape({4, 5});
  save_npy(f64, dir / "f64.npy");
  auto d = open_dataset("npy:" + (dir / "f64.npy") + "," + (dir / "y.npy"));
  at::Tensor x, y;
  d->get({0, 1, 2, 3}, x, y);
  EXPECT_EQ(x.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(x, f64.to(at::kFloat)));

  auto error_for = [&](const std::string& x_path, const std::string& y_path) {
    std::string e = error_of([&] { open_dataset("npy:" + x_path + "," + y_path); });
    EXPECT_TRUE(is_data_error(e));
    return e;
  };
  save_npy(at::tensor({0, 1, 2}, at::kLong), dir / "y3.npy");
  EXPECT_TRUE(has(error_for(dir / "u8.npy", dir / "y3.npy"), "has 4 samples, but"));
  save_npy(at::tensor({0, 1, -1, 2}, at::kLong), dir / "neg.npy");
  EXPECT_TRUE(has(error_for(dir / "u8.npy", dir / "neg.npy"), "label -1 at index 2 is negative"));
  save_npy(at::zeros({4}, at::kFloat), dir / "yf.npy");
  EXPECT_TRUE(has(error_for(dir / "u8.npy", dir / "yf.npy"), "must be integers [N], got Float"));
  save_npy(at::zeros({4}, at::kFloat), dir / "x1.npy");
  EXPECT_TRUE(has(error_for(dir / "x1.npy", dir / "y.npy"), "samples must be [N, ...]"));
  EXPECT_TRUE(has(error_for(dir / "nope.npy", dir / "y.npy"), "nope.npy': no such file"));
  write_bytes(dir / "junk.npy", "junk");
  EXPECT_TRUE(has(error_for(dir / "u8.npy", dir / "junk.npy"), "junk.npy' is not a .npy file"));
  EXPECT_TRUE(is_data_error_with(error_of([&] { open_dataset("npy:" + (dir / "u8.npy")); }),
                                 {"expected npy:X.npy,Y.npy"}));
}

// --- Specs ---------------------------------------------------------------------------------------

TEST(DataSpec, BadSpecsAreOneLineErrors) {
  std::string e = error_of([] { open_dataset("mnist"); });
  EXPECT_TRUE(is_data_error(e));
  EXPECT_TRUE(has(e, "unknown dataset 'mnist'")) << e;
  EXPECT_TRUE(has(e,
                  "fashion-mnist, idx:DIR, cifar10:DIR, folder:DIR, npy:X.npy,Y.npy or "
                  "tokens:IDS.npy"))
      << e;
  e = error_of([] { open_dataset("tfrecord:/data"); });
  EXPECT_TRUE(has(e, "unknown dataset 'tfrecord:/data'")) << e;
  EXPECT_TRUE(
      is_data_error_with(error_of([] { open_dataset("cifar10:"); }), {"expected cifar10:DIR"}));
  for (const char* kind : {"idx", "cifar10", "folder"}) {
    e = error_of([&] { open_dataset(std::string(kind) + ":/no/such/dir"); });
    EXPECT_TRUE(is_data_error(e));
    EXPECT_EQ(e, std::string("[data] ") + kind +
                     ":/no/such/dir: '/no/such/dir': no such file or directory");
  }
  EXPECT_TRUE(is_data_error_with(error_of([] { open_dataset("fashion-mnist", "val"); }),
                                 {"split must be 'train' or 'test', got 'val'"}));
}

// --- Loader --------------------------------------------------------------------------------------

TEST(DataLoader, ShuffleIsAFunctionOfSeedAndEpoch) {
  TempDir dir;
  auto d = open_dataset(counting_npy(dir, 100));
  LoaderOptions o;
  o.batch_size = 7;
  o.seed = 42;
  DataLoader a(d, o), b(d, o);
  std::vector<int64_t> sizes;
  std::vector<int64_t> a0 = epoch_labels(a, 0, &sizes), a1 = epoch_labels(a, 1);
  EXPECT_EQ(a.batches_per_epoch(), 15);
  EXPECT_EQ(sizes.size(), 15u);
  EXPECT_EQ(sizes.back(), 2);
  // Every sample exactly once per epoch.
  std::vector<int64_t> all(100);
  for (int i = 0; i < 100; ++i) all[i] = i;
  for (const auto* e : {&a0, &a1}) {
    std::vector<int64_t> sorted = *e;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, all);
  }
  EXPECT_NE(a0, all);                 // shuffled
  EXPECT_NE(a0, a1);                  // a new order each epoch
  EXPECT_EQ(epoch_labels(b, 1), a1);  // the same (seed, epoch), the same order, in any loader
  EXPECT_EQ(epoch_labels(b, 0), a0);
  EXPECT_EQ(epoch_labels(a, 0), a0);
  o.seed = 43;
  DataLoader c(d, o);
  EXPECT_NE(epoch_labels(c, 0), a0);
  o.shuffle = false;
  DataLoader plain(d, o);
  EXPECT_EQ(epoch_labels(plain, 5), all);
}

TEST(DataLoader, GivenBatchesComeOutAsTheyAreEveryEpoch) {
  // Token batches of their own lengths and sizes, labels of another integer type, named inputs.
  std::vector<Batch> given(3);
  const int64_t sizes[] = {4, 4, 2}, lengths[] = {8, 12, 5};
  for (int i = 0; i < 3; ++i) {
    given[i].x = at::randint(0, 100, {sizes[i], lengths[i]}, at::kLong);
    given[i].y = at::randint(0, 7, {sizes[i]}, at::kInt);
    given[i].inputs = {{"attention_mask", at::ones({sizes[i], lengths[i]}, at::kLong)}};
    given[i].x_input = "input_ids";
  }
  DataLoader loader(given, "data");
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  EXPECT_EQ(loader.samples_per_epoch(), 10);
  EXPECT_EQ(loader.dataset().name(), "data");
  EXPECT_EQ(loader.dataset().size(), 10);
  EXPECT_TRUE(loader.dataset().integer_samples());
  for (int epoch = 0; epoch < 2; ++epoch) {
    loader.start_epoch(epoch);
    Batch b;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(loader.next(b));
      EXPECT_TRUE(at::equal(b.x, given[i].x));
      EXPECT_EQ(b.y.scalar_type(), at::kLong);
      EXPECT_TRUE(at::equal(b.y, given[i].y.to(at::kLong)));
      ASSERT_EQ(b.inputs.size(), 1u);
      EXPECT_EQ(b.inputs[0].first, "attention_mask");
      EXPECT_EQ(b.x_input, "input_ids");
    }
    EXPECT_FALSE(loader.next(b));
  }
  // Samples read through dataset(): rows of the batches laid end to end, where shapes agree.
  at::Tensor x, y;
  loader.dataset().get({6, 5}, x, y);
  EXPECT_TRUE(at::equal(x[0], given[1].x[2]));
  EXPECT_TRUE(at::equal(x[1], given[1].x[1]));
  EXPECT_EQ(y[1].item<int64_t>(), given[1].y[1].item<int>());
  EXPECT_TRUE(is_data_error(error_of([&] { loader.dataset().get({0, 4}, x, y); })));
}

TEST(DataLoader, GivenBatchesThatCannotBeBatchesAreOneLineErrors) {
  auto err = [](std::vector<Batch> b) {
    return error_of([&] { DataLoader loader(std::move(b), "data"); });
  };
  EXPECT_TRUE(has(err({}), "[data] data has no batch"));
  Batch empty;
  empty.x = at::zeros({0, 3});
  EXPECT_TRUE(is_data_error(err({empty})));
  Batch floats;
  floats.x = at::zeros({2, 3});
  floats.y = at::zeros({2});
  EXPECT_TRUE(is_data_error_with(err({floats}), {"labels must be integers [2]"}));
  Batch short_labels;
  short_labels.x = at::zeros({2, 3});
  short_labels.y = at::zeros({3}, at::kLong);
  EXPECT_TRUE(is_data_error(err({short_labels})));
  Batch short_input;
  short_input.x = at::zeros({2, 3});
  short_input.inputs = {{"attention_mask", at::ones({1, 3})}};
  EXPECT_TRUE(has(err({short_input}), "its input 'attention_mask' is [1, 3]"));
}

TEST(DataLoader, RanksPartitionTheEpoch) {
  TempDir dir;
  auto d = open_dataset(counting_npy(dir, 101));
  LoaderOptions o;
  o.batch_size = 8;
  o.seed = 7;
  DataLoader whole(d, o);
  std::vector<int64_t> order = epoch_labels(whole, 3);
  for (int world : {2, 3}) {
    std::set<int64_t> seen;
    for (int rank = 0; rank < world; ++rank) {
      o.rank = rank, o.world = world;
      DataLoader part(d, o);
      EXPECT_EQ(part.samples_per_epoch(), 101 / world);
      std::vector<int64_t> mine = epoch_labels(part, 3);
      ASSERT_EQ(int64_t(mine.size()), 101 / world);
      // Positions rank, rank + world, ... of the epoch's order.
      for (size_t k = 0; k < mine.size(); ++k) EXPECT_EQ(mine[k], order[rank + k * world]);
      for (int64_t i : mine) EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " twice";
    }
    EXPECT_EQ(int64_t(seen.size()), 101 / world * world);
  }
  o.rank = 2, o.world = 2;
  EXPECT_TRUE(is_data_error_with(error_of([&] { DataLoader bad(d, o); }),
                                 {"rank must be in [0, world), got rank 2 of world 2"}));
  o.rank = 0, o.world = 200;
  std::string e = error_of([&] { DataLoader bad(d, o); });
  EXPECT_TRUE(has(e, "101 samples cannot be shared by 200 ranks")) << e;
}

TEST(DataLoader, DropLast) {
  TempDir dir;
  auto d = open_dataset(counting_npy(dir, 10));
  LoaderOptions o;
  o.batch_size = 4;
  std::vector<int64_t> sizes;
  DataLoader keep(d, o);
  EXPECT_EQ(keep.batches_per_epoch(), 3);
  EXPECT_EQ(keep.samples_per_epoch(), 10);
  EXPECT_EQ(epoch_labels(keep, 0, &sizes).size(), 10u);
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
  o.drop_last = true;
  DataLoader drop(d, o);
  EXPECT_EQ(drop.batches_per_epoch(), 2);
  EXPECT_EQ(drop.samples_per_epoch(), 8);
  sizes.clear();
  EXPECT_EQ(epoch_labels(drop, 0, &sizes).size(), 8u);
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4}));
}

TEST(DataLoader, NormalizesPerChannel) {
  TempDir dir;
  at::Tensor pixels = at::arange(2 * 3 * 2 * 2, at::kByte).reshape({2, 3, 2, 2}).mul(7);
  save_npy(pixels, dir / "x.npy");
  save_npy(at::tensor({0, 1}, at::kLong), dir / "y.npy");
  auto d = open_dataset("npy:" + (dir / "x.npy") + "," + (dir / "y.npy"));
  LoaderOptions o;
  o.shuffle = false;
  parse_normalize("0.1,0.2,0.3,0.5,0.25,2", o);
  DataLoader loader(d, o);
  Batch b;
  ASSERT_TRUE(loader.next(b));
  at::Tensor mean = at::tensor({0.1, 0.2, 0.3}, at::kFloat).view({3, 1, 1});
  at::Tensor std = at::tensor({0.5, 0.25, 2.0}, at::kFloat).view({3, 1, 1});
  EXPECT_TRUE(at::allclose(b.x, (pixels.to(at::kFloat) / 255 - mean) / std, 1e-6, 1e-6));
  EXPECT_FLOAT_EQ(b.x[1][2][1][1].item<float>(), (23 * 7 / 255.f - 0.3f) / 2);

  // One value for every channel.
  parse_normalize("0.5,0.5", o);
  DataLoader one(d, o);
  ASSERT_TRUE(one.next(b));
  EXPECT_TRUE(at::allclose(b.x, (pixels.to(at::kFloat) / 255 - 0.5) / 0.5, 1e-6, 1e-6));

  o.mean = {0.1, 0.2};
  o.std = {1};
  EXPECT_TRUE(is_data_error_with(error_of([&] { DataLoader bad(d, o); }),
                                 {"normalize has 2 means, but the samples have 3 channels"}));
}

TEST(DataLoader, ResizesLikeTorchvision) {
  TempDir dir;
  at::Tensor img = at::arange(2 * 4 * 6, at::kFloat).reshape({1, 2, 4, 6}).remainder(7).div(7);
  save_npy(img, dir / "x.npy");
  save_npy(at::tensor({0}, at::kLong), dir / "y.npy");
  auto d = open_dataset("npy:" + (dir / "x.npy") + "," + (dir / "y.npy"));
  LoaderOptions o;
  parse_resize("3x2", o);
  DataLoader loader(d, o);
  Batch b;
  ASSERT_TRUE(loader.next(b));
  ASSERT_EQ(b.x.sizes(), (std::vector<int64_t>{1, 2, 3, 2}));
  // torch.nn.functional.interpolate(img, size=(3, 2), mode="bilinear", antialias=True,
  // align_corners=False), torch 2.14.
  at::Tensor want =
      at::tensor({0.21071431f, 0.49285719f, 0.40178573f, 0.32142860f, 0.59285718f, 0.23750001f,
                  0.56428576f, 0.40892860f, 0.39285716f, 0.625f, 0.22142857f, 0.57857144f});
  EXPECT_TRUE(at::allclose(b.x.flatten(), want, 1e-5, 1e-6)) << b.x.flatten();

  // Resize needs images: [C, H, W] samples.
  save_npy(at::zeros({1, 5}), dir / "flat.npy");
  LoaderOptions r;
  r.resize_h = r.resize_w = 4;
  std::string e = error_of([&] {
    DataLoader bad(open_dataset("npy:" + (dir / "flat.npy") + "," + (dir / "y.npy")), r);
  });
  EXPECT_TRUE(is_data_error(e));
  EXPECT_TRUE(has(e, "resize needs image samples [C, H, W], got [5]")) << e;
}

TEST(DataLoader, StartEpochMidEpochAndDestructionStopTheThread) {
  TempDir dir;
  auto d = open_dataset(counting_npy(dir, 50));
  LoaderOptions o;
  o.batch_size = 2;
  o.prefetch = 1;
  o.shuffle = false;
  {
    DataLoader loader(d, o);
    Batch b;
    ASSERT_TRUE(loader.next(b));  // epoch 0 starts by itself
    EXPECT_EQ(longs(b.y), (std::vector<int64_t>{0, 1}));
    // The thread now waits on a full queue; a new epoch stops it and starts over.
    loader.start_epoch(1);
    EXPECT_EQ(epoch_labels(loader, 1).size(), 50u);
    EXPECT_FALSE(loader.next(b));  // the epoch is over until the next one starts
    loader.start_epoch(2);
    ASSERT_TRUE(loader.next(b));
  }  // destroyed mid-epoch with the thread blocked: must not hang
  DataLoader never_started(d, o);
}

TEST(DataLoader, BackgroundErrorsReachNextNamingTheFile) {
  TempDir dir;
  std::vector<uint8_t> px{1, 2, 3, 4};
  for (int i = 0; i < 6; ++i)
    write_png(dir / ("f/a/" + std::to_string(i) + ".png"), 2, 2, PNG_FORMAT_GRAY, px.data());
  write_png(dir / "f/b/good.png", 2, 2, PNG_FORMAT_GRAY, px.data());
  // A PNG cut inside its pixels: sample 6 of 8, in the fourth batch.
  std::string bytes = test::slurp(dir / "f/b/good.png");
  write_bytes(dir / "f/b/bad.png", bytes.substr(0, bytes.size() - 20));
  LoaderOptions o;
  o.batch_size = 2;
  o.shuffle = false;
  DataLoader loader(open_dataset("folder:" + (dir / "f")), o);
  Batch b;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader.next(b)) << i;  // the batches before it
  EXPECT_TRUE(is_data_error_with(error_of([&] { loader.next(b); }), {"f/b/bad.png': bad PNG"}));
  EXPECT_FALSE(loader.next(b));
}

// --- Option parsing ------------------------------------------------------------------------------

TEST(DataParse, Normalize) {
  LoaderOptions o;
  parse_normalize("0.5,0.25", o);
  EXPECT_EQ(o.mean, std::vector<double>{0.5});
  EXPECT_EQ(o.std, std::vector<double>{0.25});
  parse_normalize("0.485, 0.456, 0.406, 0.229, 0.224, 0.225", o);
  EXPECT_EQ(o.mean, (std::vector<double>{0.485, 0.456, 0.406}));
  EXPECT_EQ(o.std, (std::vector<double>{0.229, 0.224, 0.225}));
  for (const char* bad : {"", "0.5", "a,b", "0.5,0", "0.5,-1", "1,2,3", "0.5,0.25x", "0.5,,0.25",
                          "nan,1", "0.5,inf", "0.1,0.2,0.3,1,2"}) {
    std::string e = error_of([&] { parse_normalize(bad, o); });
    EXPECT_TRUE(is_data_error(e)) << "'" << bad << "' gave '" << e << "'";
  }
  EXPECT_EQ(o.mean.size(), 3u);  // a failed parse changes nothing
}

TEST(DataParse, Resize) {
  LoaderOptions o;
  parse_resize("28x32", o);
  EXPECT_EQ(o.resize_h, 28);
  EXPECT_EQ(o.resize_w, 32);
  for (const char* bad : {"", "28", "0x5", "5x0", "-5x5", "5x5x5", "28 x 28", "1e3x2", "x5",
                          "99999999x2", "40000x2"}) {
    std::string e = error_of([&] { parse_resize(bad, o); });
    EXPECT_TRUE(is_data_error(e)) << "'" << bad << "' gave '" << e << "'";
  }
  EXPECT_EQ(o.resize_h, 28);
}

// --- fit_to_input --------------------------------------------------------------------------------

TEST(DataFit, FashionMnistFitsAnMlpAndACnn) {
  at::Tensor x = at::rand({4, 1, 28, 28});
  at::Tensor mlp = fit_to_input(x, {-1, 784}, "input");
  EXPECT_EQ(mlp.sizes(), (std::vector<int64_t>{4, 784}));
  EXPECT_TRUE(at::equal(mlp, x.reshape({4, 784})));
  EXPECT_EQ(fit_to_input(x, {4, 784}, "input").sizes(), (std::vector<int64_t>{4, 784}));
  EXPECT_EQ(fit_to_input(mlp, {-1, 1, 28, 28}, "input").sizes(),
            (std::vector<int64_t>{4, 1, 28, 28}));
  // Dynamic sample dims: the same rank keeps the sample's shape; one dynamic dim is inferred.
  EXPECT_EQ(fit_to_input(x, {-1, 1, -1, -1}, "input").sizes(),
            (std::vector<int64_t>{4, 1, 28, 28}));
  EXPECT_EQ(fit_to_input(x, {-1, -1}, "input").sizes(), (std::vector<int64_t>{4, 784}));
  EXPECT_EQ(fit_to_input(x, {-1, 1, -1}, "input").sizes(), (std::vector<int64_t>{4, 1, 784}));

  std::string e = error_of([&] { fit_to_input(x, {-1, 3, 32, 32}, "pixel_values"); });
  EXPECT_TRUE(is_data_error(e));
  EXPECT_EQ(e,
            "[data] input 'pixel_values' takes [?, 3, 32, 32] (3072 values per sample), but the "
            "samples are [1, 28, 28] (784 values)");
  e = error_of([&] { fit_to_input(x, {-1, 3, -1, -1}, "img"); });
  EXPECT_TRUE(
      is_data_error_with(e, {"input 'img' takes [?, 3, ?, ?], but the samples are [1, 28, 28]"}));
  e = error_of([&] { fit_to_input(x, {1, 784}, "input"); });
  EXPECT_TRUE(is_data_error_with(e, {"has a fixed batch size of 1, but the batch has 4 samples"}));
}

}  // namespace
}  // namespace lopper
