// libFuzzer target: the .npy reader (lopper::parse_npy) on arbitrary bytes. lopper::Error and
// c10::Error are expected for bad input; anything else is a finding.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "lopper/error.h"
#include "lopper/npy.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    at::Tensor t = lopper::parse_npy(bytes, "fuzz.npy");
    // Touch every byte ASan can see: the tensor's storage must hold numel * itemsize.
    if (t.numel()) (void)t.view({-1}).to(at::kDouble).sum().item<double>();
  } catch (const lopper::Error&) {
  } catch (const c10::Error&) {
  }
  return 0;
}
