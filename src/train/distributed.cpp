// Data parallel on c10d: TCPStore rendezvous, then ProcessGroupGloo (cpu) or ProcessGroupNCCL
// (cuda) from the torch wheel's libtorch, behind lopper::Distributed.
#include "lopper/distributed.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

// NOTE: the wheel ships ProcessGroupGloo.hpp but not the gloo headers it includes; Debian's
// libgloo-dev provides them, from an older gloo (2022-05, 5b14351) than the one built into
// libtorch_cpu (which has gloo::IStore and the v2 store API, so gloo::rendezvous::Store's vtable
// differs). That is safe only while this file uses nothing whose layout comes from gloo: it calls
// the wheel's out-of-line createDevice*(), Options and ProcessGroupGloo constructors, holds the
// devices as opaque shared_ptrs, and talks to the group through c10d::Backend only. It must never
// define a gloo:: or GlooStore symbol and never link Debian's libgloo (DistributedAbi checks both).
#if defined(USE_C10D_GLOO) && __has_include(<gloo/config.h>)
#define LOPPER_HAVE_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <regex>
#include <thread>

#include "kernels/cuda/library.h"
#include "lopper/error.h"

namespace lopper {

namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Whole-string integer in [lo, hi], or nothing.
bool parse_int(const std::string& s, long lo, long hi, long& out) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return !s.empty() && ec == std::errc() && p == end && out >= lo && out <= hi;
}

long env_int(const char* name, long lo, long hi, const std::string& range, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  long out = 0;
  LOPPER_CHECK(parse_int(v, lo, hi, out), "[dist] ", name, " must be an integer in ", range,
               ", got '", v, "'");
  return out;
}

// "cuda:N" -> N, "cuda" -> -1 (the current device); anything else is not a cuda device.
bool cuda_index(const std::string& device, long& index) {
  if (device == "cuda") {
    index = -1;
    return true;
  }
  return device.rfind("cuda:", 0) == 0 &&
         parse_int(device.substr(5), 0, std::numeric_limits<int>::max(), index);
}

void check_device(const std::string& device) {
  long index = 0;
  LOPPER_CHECK(device == "cpu" || cuda_index(device, index),
               "[dist] device must be cpu, cuda or cuda:N, got '", device, "'");
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// The first line of a c10d/gloo error, without c10's backtrace and gloo's "[file.cc:123] " prefix.
std::string cause_of(const std::exception& e) {
  std::string s = e.what();
  if (auto* c10 = dynamic_cast<const c10::Error*>(&e)) s = c10->what_without_backtrace();
  size_t start = s.find_first_not_of(" \n");
  s = start == std::string::npos ? "" : s.substr(start);
  s = s.substr(0, s.find('\n'));
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find("] ");
    if (close != std::string::npos && s.find(':') < close) s = s.substr(close + 2);
  }
  // Gloo appends generic advice ("This is typically caused by ... GLHF!") to its I/O errors.
  size_t advice = s.find(". This is typically caused");
  if (advice != std::string::npos) s = s.substr(0, advice);
  return s;
}

// Whether a TCP connection to host:port opens before `deadline`, retrying; `why` is the last
// failure. NOTE: TCPStore's own client retries with a growing backoff that it sleeps through even
// past its timeout (a 120 s timeout can become minutes); probing first keeps the deadline ours.
bool reachable(const std::string& host, int port, Clock::time_point deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string service = std::to_string(port);
  while (true) {
    addrinfo* found = nullptr;
    int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
    if (rc != 0) why = ::gai_strerror(rc);
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      int fd =
          ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      int err = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
        pollfd p{fd, POLLOUT, 0};
        socklen_t len = sizeof err;
        if (::poll(&p, 1, int(std::clamp<int64_t>(left, 0, 1000))) != 1 ||
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
          err = ETIMEDOUT;
      }
      ::close(fd);
      if (err == 0) {
        ::freeaddrinfo(found);
        return true;
      }
      why = std::strerror(err);
    }
    if (found != nullptr) ::freeaddrinfo(found);
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(milliseconds(200), deadline - Clock::now()));
  }
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool is_timeout(const std::string& cause) {
  std::string c = lower(cause);
  return contains(c, "timed out") || contains(c, "timeout");
}

}  // namespace

DistOptions dist_options_from_env(const std::string& device) {
  check_device(device);
  DistOptions o;
  o.device = device;
  long local_rank = env_int("LOCAL_RANK", 0, std::numeric_limits<int>::max(), "[0, 2^31)", -1);
  if (device == "cuda" && local_rank >= 0) o.device = "cuda:" + std::to_string(local_rank);
  o.world = int(env_int("WORLD_SIZE", 1, std::numeric_limits<int>::max(), "[1, 2^31)", 1));
  if (o.world == 1) {
    env_int("RANK", 0, 0, "[0, WORLD_SIZE=1)", 0);
    return o;
  }
  LOPPER_CHECK(std::getenv("RANK") != nullptr, "[dist] WORLD_SIZE is ", o.world,
               " but RANK is not set");
  o.rank = int(env_int("RANK", 0, o.world - 1, detail::concat("[0, WORLD_SIZE=", o.world, ")"), 0));
  if (const char* addr = std::getenv("MASTER_ADDR")) {
    LOPPER_CHECK(*addr != '\0', "[dist] MASTER_ADDR is empty");
    o.master_addr = addr;
  }
  o.master_port = int(env_int("MASTER_PORT", 1, 65535, "[1, 65535]", o.master_port));
  return o;
}

struct Distributed::Impl {
  DistOptions o;
  milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  bool nccl = false;
  long cuda_device = -1;
  std::string failed;  // the first error: the group is unusable after it

  std::string where() const { return detail::concat(o.master_addr, ":", o.master_port); }
  std::string me() const { return detail::concat("[dist] rank ", o.rank, ": "); }

  void rendezvous();
  c10::intrusive_ptr<c10d::Backend> make_gloo();
  void check_nccl();  // before the rendezvous: a rank that cannot run NCCL says so at once
  c10::intrusive_ptr<c10d::Backend> make_nccl();
  [[noreturn]] void fail(const std::string& what, const std::exception& e);
  void check_usable(const char* what) const {
    LOPPER_CHECK(failed.empty(), me(), what, ": the process group failed earlier (",
                 failed.substr(me().size()), ")");
  }
  void wait(const char* what, const c10::intrusive_ptr<c10d::Work>& work);
  void check_tensors(const std::vector<at::Tensor>& ts, const char* what) const;
  // Defined tensors grouped by (device, dtype), in first-seen order (the same on every rank).
  std::vector<std::vector<size_t>> buckets(const std::vector<at::Tensor>& ts) const;
  void allreduce(std::vector<at::Tensor>& ts, bool mean, const char* what);
  // The collective `what` over ts's buckets: each bucket flattened (flat_of; its values copied
  // when `fill`) and started by `start`, all before any is waited for, so the backend can overlap
  // them; then each waited for and handed to `finish` with its flat buffer.
  void bucketed(
      std::vector<at::Tensor>& ts, bool fill, const char* what,
      const std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&)>& start,
      const std::function<void(const std::vector<size_t>&, at::Tensor&)>& finish);
};

void Distributed::Impl::rendezvous() {
  if (nccl) check_nccl();
  c10d::TCPStoreOptions so;
  so.port = uint16_t(o.master_port);
  so.isServer = o.rank == 0;
  so.numWorkers = size_t(o.world);
  so.waitWorkers = true;  // rank 0 learns here, with a clear message, that a rank never came
  so.timeout = timeout;
  if (o.rank > 0) {
    std::string why;
    auto deadline = Clock::now() + timeout;
    if (!reachable(o.master_addr, o.master_port, deadline, why))
      throw Error(detail::concat(me(), "could not reach the master at ", where(), " within ",
                                 o.timeout_s, " s (", why, "; is rank 0 running there?)"));
    // The master listens: what is left of the timeout is ample to connect (1 s at least).
    so.timeout = std::max<milliseconds>(
        milliseconds(1000), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  }
  try {
    store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    store->setTimeout(timeout);  // the default for the process group's rendezvous on it
  } catch (const std::exception& e) {
    std::string c = cause_of(e);
    std::smatch joined;  // TCPStore says "... 1/2 clients joined."
    if (o.rank == 0 && std::regex_search(c, joined, std::regex("([0-9]+)/[0-9]+ clients joined")))
      throw Error(detail::concat(me(), "only ", joined[1].str(), " of ", o.world,
                                 " ranks reached the master at ", where(), " within ", o.timeout_s,
                                 " s"));
    if (o.rank == 0 && is_timeout(c))
      throw Error(detail::concat(me(), "not all ", o.world, " ranks reached the master at ",
                                 where(), " within ", o.timeout_s, " s: ", c));
    if (o.rank == 0)
      throw Error(detail::concat(me(), "could not host the rendezvous at ", where(), ": ", c));
    if (is_timeout(c))
      throw Error(detail::concat(me(), "could not reach the master at ", where(), " within ",
                                 o.timeout_s, " s (is rank 0 running there?)"));
    throw Error(detail::concat(me(), "could not reach the master at ", where(), ": ", c));
  }
  try {
    backend = nccl ? make_nccl() : make_gloo();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(detail::concat(me(), "could not connect to the other ranks (",
                               nccl ? "nccl" : "gloo", ") within ", o.timeout_s,
                               " s: ", cause_of(e)));
  }
}

c10::intrusive_ptr<c10d::Backend> Distributed::Impl::make_gloo() {
#ifdef LOPPER_HAVE_GLOO
  using Gloo = c10d::ProcessGroupGloo;
  auto opts = Gloo::Options::create(timeout);
  // Like torch.distributed: GLOO_SOCKET_IFNAME names the interfaces; else the address this host's
  // name resolves to. NOTE: a loopback master means one machine, so bind loopback too: a
  // container's hostname may resolve to an address its peers cannot reach.
  const char* ifnames = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifnames != nullptr && *ifnames != '\0') {
    std::string list = ifnames;
    for (size_t a = 0; a <= list.size();) {
      size_t b = std::min(list.find(',', a), list.size());
      if (b > a) opts->devices.push_back(Gloo::createDeviceForInterface(list.substr(a, b - a)));
      a = b + 1;
    }
  } else if (is_loopback(o.master_addr)) {
    opts->devices.push_back(Gloo::createDeviceForHostname(o.master_addr));
  } else {
    opts->devices.push_back(Gloo::createDefaultDevice());
  }
  return c10::make_intrusive<Gloo>(store, o.rank, o.world, opts);
#else
  throw Error(detail::concat(me(), "this build has no Gloo (the torch wheel lacks USE_C10D_GLOO ",
                             "or the gloo headers are missing: install libgloo-dev)"));
#endif
}

// NCCL lives in liblopper_cuda.so with the rest of lopper's CUDA code (kernels/cuda/library.h).
void Distributed::Impl::check_nccl() {
  cuda_device = kernels::cuda::need_library().nccl_device(me(), o.device, cuda_device);
}

c10::intrusive_ptr<c10d::Backend> Distributed::Impl::make_nccl() {
  return kernels::cuda::need_library().nccl_backend(store, o.rank, o.world, timeout, cuda_device);
}

void Distributed::Impl::fail(const std::string& what, const std::exception& e) {
  std::string c = cause_of(e);
  std::string lc = lower(c);
  if (is_timeout(c)) {
    failed = detail::concat(me(), what, ": no answer from the other ranks within ", o.timeout_s,
                            " s (a rank died, hung or skipped this call): ", c);
  } else if (contains(lc, "closed") || contains(lc, "reset by peer") ||
             contains(lc, "broken pipe") || contains(lc, "refused") || contains(lc, "eof")) {
    failed =
        detail::concat(me(), what, ": lost the connection to another rank (did it exit?): ", c);
  } else {
    failed = detail::concat(me(), what, " failed: ", c);
  }
  throw Error(failed);
}

void Distributed::Impl::wait(const char* what, const c10::intrusive_ptr<c10d::Work>& work) {
  // NOTE: the backend's own timeout (Gloo's context, NCCL's blocking wait) fires first and names
  // the peer; this longer one only guarantees that nothing waits forever.
  try {
    work->wait(2 * timeout + milliseconds(1000));
  } catch (const std::exception& e) {
    fail(what, e);
  }
}

void Distributed::Impl::check_tensors(const std::vector<at::Tensor>& ts, const char* what) const {
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    if (!t.defined()) continue;
    LOPPER_CHECK(t.layout() == at::kStrided, me(), what, ": tensor ", i, " is not dense (layout ",
                 t.layout(), ")");
    if (o.world > 1 && nccl)
      LOPPER_CHECK(t.is_cuda() && t.get_device() == cuda_device, me(), what, ": tensor ", i,
                   " is on ", t.device(), ", but NCCL here works on cuda:", cuda_device);
  }
}

std::vector<std::vector<size_t>> Distributed::Impl::buckets(
    const std::vector<at::Tensor>& ts) const {
  std::vector<std::vector<size_t>> out;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].defined()) continue;
    auto same = [&](const std::vector<size_t>& b) {
      return ts[b[0]].device() == ts[i].device() && ts[b[0]].scalar_type() == ts[i].scalar_type();
    };
    auto it = std::find_if(out.begin(), out.end(), same);
    if (it == out.end()) {
      out.push_back({i});
    } else {
      it->push_back(i);
    }
  }
  return out;
}

namespace {

// One flat buffer for a bucket: the tensor itself when it is alone and contiguous (no copies),
// else its members concatenated (or, on a receiving rank, room for them).
at::Tensor flat_of(const std::vector<at::Tensor>& ts, const std::vector<size_t>& bucket,
                   bool fill) {
  if (bucket.size() == 1 && ts[bucket[0]].is_contiguous()) return ts[bucket[0]];
  if (!fill) {
    int64_t n = 0;
    for (size_t i : bucket) n += ts[i].numel();
    return at::empty({n}, ts[bucket[0]].options());
  }
  std::vector<at::Tensor> parts;
  parts.reserve(bucket.size());
  for (size_t i : bucket) parts.push_back(ts[i].reshape({-1}));
  return at::cat(parts);
}

void unflatten(std::vector<at::Tensor>& ts, const std::vector<size_t>& bucket,
               const at::Tensor& flat) {
  if (bucket.size() == 1 && flat.is_same(ts[bucket[0]])) {
    // The backend wrote through the data pointer, past autograd's version counter.
    if (!flat.is_inference()) flat.unsafeGetTensorImpl()->bump_version();
    return;
  }
  int64_t offset = 0;
  for (size_t i : bucket) {
    int64_t n = ts[i].numel();
    ts[i].copy_(flat.narrow(0, offset, n).view(ts[i].sizes()));
    offset += n;
  }
}

}  // namespace

void Distributed::Impl::bucketed(
    std::vector<at::Tensor>& ts, bool fill, const char* what,
    const std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>&)>& start,
    const std::function<void(const std::vector<size_t>&, at::Tensor&)>& finish) {
  std::vector<std::vector<size_t>> bs = buckets(ts);
  std::vector<at::Tensor> flats;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (const auto& b : bs) {
    flats.push_back(flat_of(ts, b, fill));
    std::vector<at::Tensor> one{flats.back()};
    try {
      works.push_back(start(one));
    } catch (const std::exception& e) {
      fail(what, e);
    }
  }
  for (size_t k = 0; k < bs.size(); ++k) {
    wait(what, works[k]);
    finish(bs[k], flats[k]);
  }
}

void Distributed::Impl::allreduce(std::vector<at::Tensor>& ts, bool mean, const char* what) {
  check_usable(what);
  check_tensors(ts, what);
  if (mean) {
    for (size_t i = 0; i < ts.size(); ++i)
      LOPPER_CHECK(!ts[i].defined() || at::isFloatingType(ts[i].scalar_type()), me(), what,
                   ": tensor ", i, " is ", ts[i].scalar_type(),
                   "; a mean needs a floating-point dtype (use allreduce_sum)");
  }
  if (o.world == 1) return;
  c10::NoGradGuard no_grad;
  bucketed(
      ts, true, what,
      [&](std::vector<at::Tensor>& one) {
        c10d::AllreduceOptions ao;
        ao.reduceOp = c10d::ReduceOp::SUM;  // Gloo has no AVG: sum, then divide
        return backend->allreduce(one, ao);
      },
      [&](const std::vector<size_t>& bucket, at::Tensor& flat) {
        if (mean) flat.div_(o.world);
        unflatten(ts, bucket, flat);
      });
}

Distributed::Distributed(const DistOptions& o) : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.o = o;
  check_device(o.device);
  LOPPER_CHECK(o.world >= 1, "[dist] world size must be >= 1, got ", o.world);
  LOPPER_CHECK(o.rank >= 0 && o.rank < o.world, "[dist] rank must be in [0, ", o.world, "), got ",
               o.rank);
  LOPPER_CHECK(o.timeout_s > 0, "[dist] timeout must be > 0 s, got ", o.timeout_s);
  d.nccl = o.device != "cpu";
  cuda_index(o.device, d.cuda_device);
  if (o.world == 1) return;  // nothing to talk to
  LOPPER_CHECK(o.master_port >= 1 && o.master_port <= 65535,
               "[dist] master port must be in [1, 65535], got ", o.master_port);
  LOPPER_CHECK(!o.master_addr.empty(), "[dist] master address is empty");
  d.timeout = milliseconds(int64_t(o.timeout_s * 1000));
  d.rendezvous();
}

Distributed::~Distributed() {
  if (!impl_ || !impl_->backend) return;
  // A group that failed may still have a collective in flight: abort it rather than wait.
  try {
    if (impl_->failed.empty()) {
      impl_->backend->shutdown();
    } else {
      impl_->backend->abort();
    }
  } catch (...) {
  }
  impl_->backend.reset();
  impl_->store.reset();
}

int Distributed::rank() const { return impl_->o.rank; }
int Distributed::world() const { return impl_->o.world; }
const DistOptions& Distributed::options() const { return impl_->o; }

void Distributed::allreduce_mean(std::vector<at::Tensor>& tensors) {
  impl_->allreduce(tensors, true, "allreduce_mean");
}

void Distributed::allreduce_sum(std::vector<at::Tensor>& tensors) {
  impl_->allreduce(tensors, false, "allreduce_sum");
}

void Distributed::broadcast(std::vector<at::Tensor>& tensors, int root) {
  Impl& d = *impl_;
  d.check_usable("broadcast");
  LOPPER_CHECK(root >= 0 && root < d.o.world, d.me(), "broadcast: root must be in [0, ", d.o.world,
               "), got ", root);
  d.check_tensors(tensors, "broadcast");
  if (d.o.world == 1) return;
  c10::NoGradGuard no_grad;
  const bool sender = d.o.rank == root;
  d.bucketed(
      tensors, sender, "broadcast",
      [&](std::vector<at::Tensor>& one) {
        c10d::BroadcastOptions bo;
        bo.rootRank = root;
        return d.backend->broadcast(one, bo);
      },
      [&](const std::vector<size_t>& bucket, at::Tensor& flat) {
        if (!sender) unflatten(tensors, bucket, flat);
      });
}

void Distributed::barrier() {
  Impl& d = *impl_;
  d.check_usable("barrier");
  if (d.o.world == 1) return;
  c10d::BarrierOptions bo;
  if (d.nccl) bo.device_ids = {d.cuda_device};
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = d.backend->barrier(bo);
  } catch (const std::exception& e) {
    d.fail("barrier", e);
  }
  d.wait("barrier", work);
}

}  // namespace lopper
