// NumPy .npy files (format versions 1-3, little-endian, C order) <-> ATen tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace lopper {

/// Reads a .npy file; throws lopper::Error naming the file for anything malformed or unsupported.
at::Tensor load_npy(const std::string& path);
/// Parses .npy bytes (what `path` names is used in errors only).
at::Tensor parse_npy(const std::string& bytes, const std::string& path);
/// Writes a tensor as .npy (atomically).
void save_npy(const at::Tensor& t, const std::string& path);
/// A tensor as the bytes of a .npy file.
std::string npy_bytes(const at::Tensor& t);

}  // namespace lopper
