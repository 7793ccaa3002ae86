// lopper's public API in one include: what a program embedding lopper needs to read and write
// ONNX models (lopper/onnx_io.h, lopper/graph.h), run them with ATen on the CPU or a GPU
// (lopper/executor.h), measure their cost and latency (lopper/analysis.h, lopper/latency.h),
// prune them — unstructured, N:M, structured, to a target, from sensitivity curves
// (lopper/prune.h, lopper/structured.h, lopper/target.h, lopper/sensitivity.h) —, fine-tune them,
// alone or data parallel (lopper/train.h, lopper/distributed.h), on datasets (lopper/data.h), and
// write reports (lopper/report.h). Every user or model error is a lopper::Error (lopper/error.h).
// Tensors are ATen's (at::Tensor); this header brings ATen's functions (<ATen/ATen.h>) too, so that
// a program can make the tensors it feeds the executor.
//
// Link the CMake target lopper::lopper (find_package(lopper); see examples/embed/). In short:
//
//   #include <lopper/lopper.h>
//
//   lopper::ir::Model model = lopper::onnx::load_model("model.onnx");
//   lopper::StructuredOptions opts;
//   opts.amount.value = 0.5;  // half of every group's channels
//   lopper::prune_structured(model, opts);
//   lopper::Executor exec(model);  // cpu, inference; model must outlive it
//   at::Tensor x = at::randn({1, 3, 224, 224});
//   std::vector<at::Tensor> out = exec.run({{exec.inputs()[0]->name, x}});
//   lopper::onnx::save_model(model, "model.pruned.onnx");
//
// A complete program: examples/embed.cpp.
#pragma once

// NOTE: only programs include this header; lopper's own sources include the one header of each
// concern they use, and ATen's full set of functions only where they must (compile time).
#include <ATen/ATen.h>

#include "lopper/analysis.h"
#include "lopper/command.h"
#include "lopper/data.h"
#include "lopper/distributed.h"
#include "lopper/error.h"
#include "lopper/executor.h"
#include "lopper/files.h"
#include "lopper/graph.h"
#include "lopper/latency.h"
#include "lopper/memory.h"
#include "lopper/npy.h"
#include "lopper/onnx_io.h"
#include "lopper/progress.h"
#include "lopper/prune.h"
#include "lopper/report.h"
#include "lopper/sensitivity.h"
#include "lopper/structured.h"
#include "lopper/target.h"
#include "lopper/train.h"
