// A caching CPU allocator for ATen (internal).
#pragma once

namespace lopper::exec {

/// Installs, once per process, a CPU allocator that keeps freed blocks of 64 KiB and more for
/// reuse (up to a bounded total), instead of giving them back to the OS.
/// NOTE: glibc serves large blocks with fresh mmap()ed pages, so every inference paid a page fault
/// per 4 KiB of every large activation: ~20% of a batch-32 CNN's time, and 2x on mobilenet_v2.
/// Blocks under its mmap threshold fare no better when it trims its heap: a decoding step's key
/// and value caches (263 KB each) took 0.3-0.5 ms a copy.
/// A request takes the most recently freed block of its size up to twice it (ONNX Runtime plans
/// its activations into a few shared buffers to the same end): the next layer writes into memory
/// still in the caches, instead of a block of its exact size last touched a whole run ago. In a
/// model that outgrows the last-level cache this took MobileNetV3-Large from 4.37 to 4.01 ms.
void install_caching_cpu_allocator();

/// Gives every cached block back to the OS: for a job whose shapes change (one model block after
/// another) and whose memory must stay bounded.
void empty_cpu_cache();

}  // namespace lopper::exec
