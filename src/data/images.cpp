// The image folder dataset: PNG (libpng) and JPEG (libjpeg-turbo) decoded to uint8 HWC, then CHW
// float in [0, 1]; images are decoded in get(), i.e. on the loader's background thread.
#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>

// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include "data/images.h"
#include "lopper/error.h"
#include "lopper/files.h"

namespace lopper::data {
namespace fs = std::filesystem;

namespace {

// Large enough for any dataset image, small enough that a hostile header cannot exhaust memory.
constexpr int64_t kMaxSide = 1 << 15, kMaxPixels = int64_t(1) << 28;

struct Image {
  int64_t h = 0, w = 0, c = 0;
  std::vector<uint8_t> pixels;  // h x w x c
};

void check_size(int64_t h, int64_t w, const std::string& path) {
  LOPPER_CHECK(h > 0 && w > 0 && h <= kMaxSide && w <= kMaxSide && h * w <= kMaxPixels, "'", path,
               "': image size ", h, "x", w, " is out of range");
}

// NOTE: libpng and libjpeg report fatal errors through a callback that must not return; it
// longjmps back to the decoder (the libraries' own protocol; a C++ throw through their C frames is
// not safe), which then throws. Every object with a destructor is constructed before the setjmp,
// so the jump skips none, and what the decoder fills lives in the context the library also holds
// a pointer to, so none of it is left stale in a register the jump restores.

// --- PNG -----------------------------------------------------------------------------------------

struct PngContext {
  std::jmp_buf jmp;
  char msg[256] = "";
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  Image img;
  std::vector<png_bytep> rows;
};

void png_on_error(png_structp png, png_const_charp msg) {
  auto* ctx = static_cast<PngContext*>(png_get_error_ptr(png));
  std::snprintf(ctx->msg, sizeof ctx->msg, "%s", msg);
  std::longjmp(ctx->jmp, 1);
}
void png_on_warning(png_structp, png_const_charp) {}  // e.g. a bad ancillary chunk: not fatal

void png_read_memory(png_structp png, png_bytep out, size_t n) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  if (n > ctx->size - ctx->pos) png_error(png, "unexpected end of file");
  std::memcpy(out, ctx->data + ctx->pos, n);
  ctx->pos += n;
}

struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngReader() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

Image decode_png(const std::string& bytes, const std::string& path) {
  PngContext ctx;
  ctx.data = reinterpret_cast<const uint8_t*>(bytes.data());
  ctx.size = bytes.size();
  PngReader r;
  Image& img = ctx.img;
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, png_on_error, png_on_warning);
  LOPPER_CHECK(r.png, "'", path, "': out of memory for libpng");
  r.info = png_create_info_struct(r.png);
  LOPPER_CHECK(r.info, "'", path, "': out of memory for libpng");
  if (setjmp(ctx.jmp)) throw Error(detail::concat("'", path, "': bad PNG: ", ctx.msg));
  png_set_read_fn(r.png, &ctx, png_read_memory);
  png_read_info(r.png, r.info);
  png_uint_32 w = png_get_image_width(r.png, r.info), h = png_get_image_height(r.png, r.info);
  check_size(h, w, path);
  int depth = png_get_bit_depth(r.png, r.info), type = png_get_color_type(r.png, r.info);
  // Everything to 8-bit gray or RGB: palettes expand, 1/2/4-bit gray widens, 16-bit scales
  // (v * 255 / 65535, rounded), alpha is dropped, including the alpha a palette's transparency
  // (tRNS) expands to. No gamma is applied, as PIL applies none.
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r.png);
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(r.png);
  if (depth == 16) png_set_scale_16(r.png);
  if ((type & PNG_COLOR_MASK_ALPHA) || png_get_valid(r.png, r.info, PNG_INFO_tRNS))
    png_set_strip_alpha(r.png);
  png_set_interlace_handling(r.png);
  png_read_update_info(r.png, r.info);
  img.h = h, img.w = w, img.c = png_get_channels(r.png, r.info);
  if ((img.c != 1 && img.c != 3) || png_get_rowbytes(r.png, r.info) != size_t(w * img.c))
    png_error(r.png, "unexpected pixel layout after conversion");
  img.pixels.resize(size_t(h) * w * img.c);
  ctx.rows.resize(h);
  for (png_uint_32 i = 0; i < h; ++i) ctx.rows[i] = img.pixels.data() + size_t(i) * w * img.c;
  png_read_image(r.png, ctx.rows.data());
  // The end (IEND and what follows the pixels) is not read: a file cut after its pixels decodes.
  return std::move(img);
}

// --- JPEG ----------------------------------------------------------------------------------------

struct JpegContext {
  jpeg_error_mgr mgr;  // first, so that the library's j_common_ptr->err points at the context
  std::jmp_buf jmp;
  char msg[JMSG_LENGTH_MAX] = "";
  bool truncated = false;
  Image img;
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* ctx = reinterpret_cast<JpegContext*>(cinfo->err);
  cinfo->err->format_message(cinfo, ctx->msg);
  std::longjmp(ctx->jmp, 1);
}
// Corrupt-data warnings are recoverable (PIL decodes such files too); running out of data is not:
// the library would pad the image with gray.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF)
    reinterpret_cast<JpegContext*>(cinfo->err)->truncated = true;
}

struct JpegReader {
  jpeg_decompress_struct cinfo{};
  ~JpegReader() { jpeg_destroy_decompress(&cinfo); }  // safe on a struct never created (mem null)
};

Image decode_jpeg(const std::string& bytes, const std::string& path) {
  JpegContext ctx;
  JpegReader r;
  Image& img = ctx.img;
  r.cinfo.err = jpeg_std_error(&ctx.mgr);
  ctx.mgr.error_exit = jpeg_on_error;
  ctx.mgr.emit_message = jpeg_on_message;
  if (setjmp(ctx.jmp)) throw Error(detail::concat("'", path, "': bad JPEG: ", ctx.msg));
  jpeg_create_decompress(&r.cinfo);
  jpeg_mem_src(&r.cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&r.cinfo, TRUE);
  check_size(r.cinfo.image_height, r.cinfo.image_width, path);
  J_COLOR_SPACE in = r.cinfo.jpeg_color_space;
  LOPPER_CHECK(in != JCS_CMYK && in != JCS_YCCK, "'", path, "': CMYK JPEGs are not supported");
  r.cinfo.out_color_space = in == JCS_GRAYSCALE ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&r.cinfo);
  img.h = r.cinfo.output_height, img.w = r.cinfo.output_width, img.c = r.cinfo.output_components;
  img.pixels.resize(size_t(img.h * img.w * img.c));
  while (r.cinfo.output_scanline < r.cinfo.output_height) {
    JSAMPROW row = img.pixels.data() + size_t(r.cinfo.output_scanline) * img.w * img.c;
    jpeg_read_scanlines(&r.cinfo, &row, 1);
  }
  jpeg_finish_decompress(&r.cinfo);
  LOPPER_CHECK(!ctx.truncated, "'", path, "': bad JPEG: the file is truncated");
  return std::move(img);
}

// --- Folders -------------------------------------------------------------------------------------

// Decodes by content (a .jpg that is really a PNG still reads) and converts to `channels`: gray to
// RGB by repetition, RGB to gray by ITU-R 601 luma in PIL's integer arithmetic (convert("L")).
at::Tensor load_image(const std::string& path, int64_t channels) {
  std::string bytes = read_file(path);
  auto starts = [&](const char* sig, size_t n) {
    return bytes.size() >= n && std::memcmp(bytes.data(), sig, n) == 0;
  };
  Image img;
  if (starts("\x89PNG\r\n\x1a\n", 8))
    img = decode_png(bytes, path);
  else if (starts("\xff\xd8\xff", 3))
    img = decode_jpeg(bytes, path);
  else
    throw Error(detail::concat("'", path, "': not a PNG or JPEG image"));
  if (channels == 0) channels = img.c;
  if (img.c == 3 && channels == 1) {
    for (size_t i = 0, n = size_t(img.h * img.w); i < n; ++i) {
      const uint8_t* p = &img.pixels[3 * i];
      img.pixels[i] = uint8_t((p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16);
    }
    img.pixels.resize(size_t(img.h * img.w));
    img.c = 1;
  }
  at::Tensor hwc = at::from_blob(img.pixels.data(), {img.h, img.w, img.c}, at::kByte);
  if (img.c == 1 && channels == 3) hwc = hwc.expand({img.h, img.w, 3});
  // The copy into a fresh tensor leaves nothing pointing at img.pixels.
  at::Tensor chw = at::empty({channels, img.h, img.w}, at::kFloat);
  chw.copy_(hwc.permute({2, 0, 1}));
  return chw.div_(255);
}

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  for (char& ch : ext) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

class FolderDataset : public Dataset {
 public:
  FolderDataset(std::string spec, std::string split, const std::string& root)
      : spec_(std::move(spec)), split_(std::move(split)) {
    // Listing errors and per-entry queries keep separate error codes: a query must not clear an
    // error the iteration reported.
    std::error_code list_ec, q;
    std::vector<fs::path> classes;
    for (fs::directory_iterator it(root, list_ec), end; !list_ec && it != end;
         it.increment(list_ec))
      if (it->is_directory(q) && it->path().filename().string()[0] != '.')
        classes.push_back(it->path());
    LOPPER_CHECK(!list_ec, "[data] ", spec_, ": cannot list '", root, "': ", list_ec.message());
    LOPPER_CHECK(!classes.empty(), "[data] ", spec_, ": '", root,
                 "' has no class subfolders (one per class, holding PNG/JPEG images)");
    std::sort(classes.begin(), classes.end());
    for (size_t label = 0; label < classes.size(); ++label) {
      std::vector<std::string> files;
      auto opts = fs::directory_options::follow_directory_symlink;
      for (fs::recursive_directory_iterator it(classes[label], opts, list_ec), end;
           !list_ec && it != end; it.increment(list_ec)) {
        // Hidden entries (.git, macOS's ._name.jpg) are never samples.
        if (it->path().filename().string()[0] == '.') {
          if (it->is_directory(q)) it.disable_recursion_pending();
          continue;
        }
        if (it->is_regular_file(q) && is_image_file(it->path()))
          files.push_back(it->path().string());
      }
      LOPPER_CHECK(!list_ec, "[data] ", spec_, ": cannot list '", classes[label].string(),
                   "': ", list_ec.message());
      LOPPER_CHECK(!files.empty(), "[data] ", spec_, ": class folder '", classes[label].string(),
                   "' holds no .png/.jpg/.jpeg images");
      std::sort(files.begin(), files.end());
      for (auto& f : files) files_.push_back(std::move(f)), labels_.push_back(int64_t(label));
    }
    num_classes_ = int64_t(classes.size());
    // The first image fixes the channels and the size every batch must share.
    at::Tensor first = load(0);
    shape_ = first.sizes().vec();
  }

  int64_t size() const override { return int64_t(files_.size()); }
  std::vector<int64_t> sample_shape() const override { return shape_; }
  int64_t num_classes() const override { return num_classes_; }
  std::string name() const override { return spec_ + " (" + split_ + ")"; }

  void get(const std::vector<int64_t>& indices, at::Tensor& x, at::Tensor& y) const override {
    std::vector<at::Tensor> xs;
    for (int64_t i : indices) {
      xs.push_back(load(i));
      LOPPER_CHECK(xs.back().sizes() == at::IntArrayRef(shape_), "[data] ", spec_, ": '", files_[i],
                   "' is ", xs.back().size(1), "x", xs.back().size(2), ", but '", files_[0],
                   "' is ", shape_[1], "x", shape_[2],
                   "; images of a folder must share one size unless they are resized");
    }
    stack(indices, xs, x, y);
  }

  void get_resized(const std::vector<int64_t>& indices, int64_t h, int64_t w, at::Tensor& x,
                   at::Tensor& y) const override {
    std::vector<at::Tensor> xs;
    for (int64_t i : indices) xs.push_back(resize_images(load(i).unsqueeze(0), h, w).squeeze(0));
    stack(indices, xs, x, y);
  }

 private:
  at::Tensor load(int64_t i) const {
    LOPPER_CHECK(i >= 0 && i < size(), "[data] ", name(), ": sample ", i, " is out of range [0, ",
                 size(), ")");
    try {
      return load_image(files_[i], shape_.empty() ? 0 : shape_[0]);
    } catch (const Error& e) {
      throw Error(detail::concat("[data] ", spec_, ": ", e.what()));
    }
  }

  void stack(const std::vector<int64_t>& indices, const std::vector<at::Tensor>& xs, at::Tensor& x,
             at::Tensor& y) const {
    std::vector<int64_t> labels;
    for (int64_t i : indices) labels.push_back(labels_[i]);
    x = xs.empty() ? at::empty({0, shape_[0], shape_[1], shape_[2]}, at::kFloat) : at::stack(xs);
    y = at::tensor(at::IntArrayRef(labels), at::kLong);
  }

  std::string spec_, split_;
  std::vector<std::string> files_;
  std::vector<int64_t> labels_;
  int64_t num_classes_ = 0;
  std::vector<int64_t> shape_;  // the first image's [C, H, W]
};

}  // namespace

at::Tensor resize_images(const at::Tensor& x, int64_t h, int64_t w) {
  if (x.size(2) == h && x.size(3) == w) return x;
  // align_corners=false with antialiasing is torchvision's Resize(antialias=True) on tensors.
  return at::_upsample_bilinear2d_aa(x, at::IntArrayRef{h, w}, /*align_corners=*/false,
                                     std::nullopt);
}

std::shared_ptr<Dataset> open_folder(const std::string& spec, const std::string& dir,
                                     const std::string& split) {
  std::error_code ec;
  LOPPER_CHECK(fs::exists(dir, ec), no_such(spec, dir));
  LOPPER_CHECK(fs::is_directory(dir, ec), "[data] ", spec, ": '", dir, "' is not a folder");
  // DIR/train and DIR/test when the folder is split; DIR itself otherwise. Asking for a split the
  // folder lacks is an error (not "train" read as a class).
  fs::path sub = fs::path(dir) / split;
  if (fs::is_directory(sub, ec)) return std::make_shared<FolderDataset>(spec, split, sub.string());
  bool split_layout =
      fs::is_directory(fs::path(dir) / "train", ec) || fs::is_directory(fs::path(dir) / "test", ec);
  LOPPER_CHECK(!split_layout, no_such(spec, sub.string()));
  return std::make_shared<FolderDataset>(spec, split, dir);
}

}  // namespace lopper::data
