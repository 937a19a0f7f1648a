// A reference PrivateUse1 device, "npu": what fxwrap's out-of-tree device tests run on.
//
// Two things make it like real hardware, where a host-memory toy device is not:
//  * Device memory is not host memory.  A tensor's data_ptr() is a handle inside an address
//    range reserved with PROT_NONE: the host faults on it, as it would on a device pointer.
//    The runtime finds the host block behind a handle (an interior handle too: a view's).
//  * Work is asynchronous.  Every stream is a worker thread with a FIFO queue; launches and
//    copies to the device are queued and return at once.  Reading device memory on the
//    host (a copy to the CPU, .item()) waits for the stream first.
// Everything else a backend needs: a DeviceGuardImpl (devices, streams, events), hooks, a
// few native ATen ops (allocation, views, copies, resize) and a CPU fallback for the rest.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace npu {

constexpr int kDevices = 2;
constexpr int kStreamsPerDevice = 8;  // stream 0: the default one; 1..7 handed out in turn
constexpr uintptr_t kHeapBytes = uintptr_t(1) << 40;

// ---------------------------------------------------------------- the device heap
struct Block { void* host; size_t bytes; };

struct Heap {
  std::mutex mu;
  uintptr_t base = 0, next = 0;
  std::map<uintptr_t, Block> blocks;  // handle -> its host block

  Heap() {
    void* p = mmap(nullptr, kHeapBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TORCH_CHECK(p != MAP_FAILED, "npu: cannot reserve the device address range");
    base = next = reinterpret_cast<uintptr_t>(p);
  }
  uintptr_t allocate(size_t bytes) {
    void* host = std::malloc(bytes ? bytes : 1);
    TORCH_CHECK(host, "npu: out of memory allocating ", bytes, " bytes");
    std::lock_guard<std::mutex> g(mu);
    uintptr_t handle = next;
    next += (bytes + 511) / 512 * 512 + 512;  // a gap: one block's end is never another's start
    TORCH_CHECK(next < base + kHeapBytes, "npu: device address range exhausted");
    blocks[handle] = {host, bytes};
    return handle;
  }
  void release(uintptr_t handle) {
    void* host;
    {
      std::lock_guard<std::mutex> g(mu);
      auto it = blocks.find(handle);
      if (it == blocks.end()) return;
      host = it->second.host;
      blocks.erase(it);
    }
    std::free(host);
  }
  // the host address behind a device address (nullptr stays nullptr)
  void* translate(uintptr_t addr) {
    if (addr == 0) return nullptr;
    std::lock_guard<std::mutex> g(mu);
    auto it = blocks.upper_bound(addr);
    TORCH_CHECK(it != blocks.begin(), "npu: ", reinterpret_cast<void*>(addr), " is no device address");
    --it;
    TORCH_CHECK(addr <= it->first + it->second.bytes, "npu: ", reinterpret_cast<void*>(addr),
                " is past the end of its block");
    return static_cast<char*>(it->second.host) + (addr - it->first);
  }
};
Heap& heap() { static Heap* h = new Heap(); return *h; }

// ---------------------------------------------------------------- streams and events
std::atomic<int64_t> g_host_syncs{0};  // host waits that user code asked for (counted)

struct Queue {
  std::mutex mu;
  std::condition_variable cv, idle;
  std::deque<std::function<void()>> work;
  uint64_t enqueued = 0, completed = 0;
  std::string error;  // the first failure of queued work: sticky, raised by the next wait
  std::thread worker;
  Queue() : worker([this] { run(); }) { worker.detach(); }
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [this] { return !work.empty(); });
        task = std::move(work.front());
      }
      std::string failed;
      try {
        task();
      } catch (const std::exception& e) {
        failed = e.what();
      }
      {
        std::lock_guard<std::mutex> l(mu);
        if (!failed.empty() && error.empty()) error = failed;
        work.pop_front();
        ++completed;
      }
      idle.notify_all();
    }
  }
  uint64_t push(std::function<void()> task) {
    std::lock_guard<std::mutex> l(mu);
    work.push_back(std::move(task));
    cv.notify_one();
    return ++enqueued;
  }
  void wait_for(uint64_t ticket) {
    std::unique_lock<std::mutex> l(mu);
    idle.wait(l, [&] { return completed >= ticket; });
    TORCH_CHECK(error.empty(), "npu: queued work failed: ", error);
  }
  void drain() { uint64_t t; { std::lock_guard<std::mutex> l(mu); t = enqueued; } wait_for(t); }
  uint64_t done() { std::lock_guard<std::mutex> l(mu); return completed; }
  uint64_t queued() { std::lock_guard<std::mutex> l(mu); return enqueued; }
};

Queue& queue(int device, int64_t stream) {
  static Queue* queues = new Queue[kDevices * kStreamsPerDevice];
  TORCH_CHECK(device >= 0 && device < kDevices && stream >= 0 && stream < kStreamsPerDevice,
              "npu: no stream ", stream, " on device ", device);
  return queues[device * kStreamsPerDevice + stream];
}

thread_local int t_device = 0;
thread_local int64_t t_stream[kDevices] = {};
std::atomic<int64_t> g_next_stream{1};

// A free waits for the work queued before it on every stream (of every device: a copy
// between devices may read the block on the other one).
struct PendingFree { uintptr_t handle; std::vector<uint64_t> tickets; };
std::mutex g_free_mu;
std::vector<PendingFree> g_frees;

void collect_frees() {
  std::vector<uintptr_t> ready;
  {
    std::lock_guard<std::mutex> g(g_free_mu);
    auto it = g_frees.begin();
    while (it != g_frees.end()) {
      bool done = true;
      for (int q = 0; q < kDevices * kStreamsPerDevice && done; ++q)
        done = queue(q / kStreamsPerDevice, q % kStreamsPerDevice).done() >= it->tickets[q];
      if (done) { ready.push_back(it->handle); it = g_frees.erase(it); } else ++it;
    }
  }
  for (auto h : ready) heap().release(h);
}

struct Event {
  std::mutex mu;
  std::condition_variable cv;
  bool recorded = false, done = false;
  std::chrono::steady_clock::time_point at;
  int device = 0;
};

void record(Event* e, int device, int64_t stream) {
  {
    std::lock_guard<std::mutex> l(e->mu);
    e->recorded = true;
    e->done = false;
    e->device = device;
  }
  queue(device, stream).push([e] {
    std::lock_guard<std::mutex> l(e->mu);
    e->at = std::chrono::steady_clock::now();
    e->done = true;
    e->cv.notify_all();
  });
}
void wait_event(Event* e) {
  std::unique_lock<std::mutex> l(e->mu);
  e->cv.wait(l, [e] { return !e->recorded || e->done; });
}

// ---------------------------------------------------------------- the allocator
void free_handle(void* ctx) {
  PendingFree f{reinterpret_cast<uintptr_t>(ctx), std::vector<uint64_t>(kDevices * kStreamsPerDevice)};
  for (int q = 0; q < kDevices * kStreamsPerDevice; ++q)
    f.tickets[q] = queue(q / kStreamsPerDevice, q % kStreamsPerDevice).queued();
  {
    std::lock_guard<std::mutex> g(g_free_mu);
    g_frees.push_back(std::move(f));
  }
  collect_frees();
}

void copy_in_stream_order(void* dst, const void* src, size_t bytes);

struct Allocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    collect_frees();
    uintptr_t h = heap().allocate(n);
    void* p = reinterpret_cast<void*>(h);
    return {p, p, &free_handle, c10::Device(c10::DeviceType::PrivateUse1, t_device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_handle; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    copy_in_stream_order(dest, src, count);
  }
};
Allocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

int64_t current_stream(int device) { return t_stream[device]; }

// a device-to-device byte copy, queued on the current stream
void copy_in_stream_order(void* dst, const void* src, size_t bytes) {
  auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  queue(t_device, current_stream(t_device)).push([d, s, bytes] {
    std::memcpy(heap().translate(d), heap().translate(s), bytes);
  });
}

// ---------------------------------------------------------------- the guard
// a device without an index ("npu") is the current one
int index_of(c10::Device d) { return d.has_index() ? d.index() : t_device; }
int index_of(const c10::Stream& s) { return index_of(s.device()); }

struct Guard final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType T = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return T; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old(T, t_device);
    t_device = index_of(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(T, t_device); }
  void setDevice(c10::Device d) const override { t_device = index_of(d); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { t_device = index_of(d); }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(T, index_of(d)), t_stream[index_of(d)]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(T, index_of(d)), 0);
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    int64_t id = 1 + (g_next_stream++ - 1) % (kStreamsPerDevice - 1);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(T, index_of(d)), id);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getNewStream(d, 0); }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto old = getStream(s.device());
    t_stream[index_of(s)] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDevices; }
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (*event == nullptr) *event = new Event();
    npu::record(static_cast<Event*>(*event), index_of(s), s.id());
  }
  void block(void* event, const c10::Stream& s) const override {
    if (event == nullptr) return;
    auto* e = static_cast<Event*>(event);
    queue(index_of(s), s.id()).push([e] { wait_event(e); });
  }
  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    auto* e = static_cast<Event*>(event);
    std::lock_guard<std::mutex> l(e->mu);
    return !e->recorded || e->done;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    // a destroyed event may still be queued: wait for it to pass first
    if (event != nullptr) { wait_event(static_cast<Event*>(event)); delete static_cast<Event*>(event); }
  }
  bool queryStream(const c10::Stream& s) const override {
    auto& q = queue(index_of(s), s.id());
    return q.done() >= q.queued();
  }
  void synchronizeStream(const c10::Stream& s) const override {
    ++g_host_syncs;
    queue(index_of(s), s.id()).drain();
  }
  void synchronizeEvent(void* event) const override {
    ++g_host_syncs;
    if (event != nullptr) wait_event(static_cast<Event*>(event));
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override {
    ++g_host_syncs;
    for (int s = 0; s < kStreamsPerDevice; ++s) queue(d, s).drain();
  }
  double elapsedTime(void* a, void* b, const c10::DeviceIndex) const override {
    auto *e1 = static_cast<Event*>(a), *e2 = static_cast<Event*>(b);
    TORCH_CHECK(e1 && e2, "npu: elapsed_time of an event that was never recorded");
    wait_event(e1);
    wait_event(e2);
    return std::chrono::duration<double, std::milli>(e2->at - e1->at).count();
  }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

// ---------------------------------------------------------------- hooks
struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  bool isPinnedPtr(const void*) const override { return false; }
  c10::DeviceIndex deviceCount() const override { return kDevices; }
  c10::DeviceIndex getCurrentDevice() const override { return t_device; }
  void setCurrentDevice(c10::DeviceIndex d) const override { t_device = d; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override { auto o = t_device; t_device = d; return o; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  at::Device getDeviceFromPtr(void*) const override { return at::Device(c10::DeviceType::PrivateUse1, t_device); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();  // random ops run on the CPU (the fallback)
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;
};

// ---------------------------------------------------------------- host <-> device
// The bytes of a device tensor's storage span, to the host, after the stream's work.
at::Tensor span_to_host(const at::Tensor& t) {
  int64_t lo = t.storage_offset(), hi = lo + 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) { hi = lo; break; }
    hi += (t.size(d) - 1) * t.stride(d);
  }
  auto host = at::empty({std::max<int64_t>(hi - lo, 0)}, t.options().device(at::kCPU));
  int device = t.device().index();
  queue(device, current_stream(device)).drain();
  if (hi > lo) {
    void* src = heap().translate(reinterpret_cast<uintptr_t>(t.data_ptr()));
    // data_ptr() is the first element's handle: lo of the span is the storage offset itself
    std::memcpy(host.data_ptr(), src, (hi - lo) * t.element_size());
  }
  return host.as_strided(t.sizes(), t.strides(), 0);
}

// The host tensor's values written into a device tensor (same sizes), queued on the stream.
void host_to_device(const at::Tensor& src, const at::Tensor& dst) {
  at::Tensor values;
  bool dense = dst.is_non_overlapping_and_dense();
  if (dense) {
    // a host tensor laid out like dst, so one byte copy fills its span
    values = at::empty_strided(dst.sizes(), dst.strides(), dst.options().device(at::kCPU));
    values.copy_(src);
  } else {
    values = span_to_host(dst);  // keep the elements dst does not cover
    values.copy_(src);
  }
  int64_t span = 1;
  for (int64_t d = 0; d < dst.dim(); ++d) span += (dst.size(d) - 1) * dst.stride(d);
  if (dst.numel() == 0) return;
  auto bytes = span * dst.element_size();
  auto keep = std::make_shared<at::Tensor>(values);
  auto to = reinterpret_cast<uintptr_t>(dst.data_ptr());
  void* from = values.data_ptr();
  int device = dst.device().index();
  queue(device, current_stream(device)).push([keep, to, from, bytes] {
    std::memcpy(heap().translate(to), from, bytes);
  });
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size, std::optional<at::MemoryFormat> memory_format);

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) return dst;
  if (self.is_cpu() && dst.is_privateuseone()) {
    host_to_device(self, dst);
  } else if (self.is_privateuseone() && dst.is_cpu()) {
    ++g_host_syncs;  // a host read of device memory waits for the stream, as on hardware
    dst.copy_(span_to_host(self));
  } else {
    TORCH_CHECK(self.is_privateuseone() && dst.is_privateuseone(), "npu: _copy_from from ",
                self.device(), " to ", dst.device());
    if (self.dtype() == dst.dtype() && self.sizes() == dst.sizes() && self.strides() == dst.strides()
        && self.is_non_overlapping_and_dense() && self.is_contiguous() && dst.is_contiguous()) {
      c10::DeviceGuard g(dst.device());
      copy_in_stream_order(dst.data_ptr(), self.data_ptr(), self.numel() * self.element_size());
    } else {
      host_to_device(span_to_host(self), dst);  // through the host, in stream order
    }
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize(dst, c10::fromIntArrayRefSlow(self.sizes()), std::nullopt);
  return copy_from(self, dst, false);
}

void Hooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  auto* impl = storage.unsafeGetStorageImpl();
  size_t old = impl->nbytes();
  if (newsize == old) return;
  c10::DataPtr fresh = g_allocator.allocate(newsize);
  if (old > 0 && newsize > 0) copy_in_stream_order(fresh.get(), impl->data(), std::min(old, newsize));
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(newsize);
}

// ---------------------------------------------------------------- native ops
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device>, std::optional<bool>,
                               std::optional<at::MemoryFormat> memory_format) {
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  return at::detail::empty_generic(size, &g_allocator, ks, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device>, std::optional<bool>) {
  constexpr c10::DispatchKeySet ks(c10::DispatchKey::PrivateUse1);
  return at::detail::empty_strided_generic(size, stride, &g_allocator, ks, c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(offset));
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(C10_AS_INTARRAYREF_SLOW(size));
  if (memory_format.has_value() && *memory_format != at::MemoryFormat::Preserve)
    impl->empty_tensor_restride(*memory_format);
  size_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.dtype().itemsize(),
                                                   self.storage_offset());
  if (needed > self.storage().nbytes()) at::detail::getPrivateUse1Hooks().resizePrivateUse1Bytes(self.storage(), needed);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, c10::SymInt offset, c10::SymIntArrayRef size,
                        c10::SymIntArrayRef stride) {
  return at::cpu::set__symint(self, source, offset, size, stride);
}
at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return at::cpu::set_(self, source, 0, {n}, {1});
}
at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) { return at::cpu::set_(self, source); }
at::Tensor& set_empty(at::Tensor& self) { return at::cpu::set_(self); }

// convolution reaches backends through these two (no fallback): on the CPU, like the rest
at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  std::optional<at::Tensor> host_bias;
  if (bias.has_value() && bias->defined()) host_bias = bias->cpu();
  auto out = at::convolution(input.cpu(), weight.cpu(), host_bias, stride, padding, dilation, transposed,
                             output_padding, groups);
  return out.to(input.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  std::vector<int64_t> bias_sizes{transposed ? weight.size(1) * groups : weight.size(0)};
  auto [gi, gw, gb] = at::convolution_backward(grad_output.cpu(), input.cpu(), weight.cpu(), bias_sizes, stride,
                                               padding, dilation, transposed, output_padding, groups, output_mask);
  auto back = [&](const at::Tensor& t) { return t.defined() ? t.to(input.device()) : t; };
  return {back(gi), back(gw), back(gb)};
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::native::cpu_fallback(op, stack);  // through _copy_from: inputs wait for the stream
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("resize_", resize);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("convolution_overrideable", convolution);
  m.impl("convolution_backward_overrideable", convolution_backward);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}


struct Register {
  Register() { at::RegisterPrivateUse1HooksInterface(new Hooks()); }
} g_register;

}  // namespace npu

// ---------------------------------------------------------------- the C API (ctypes)
extern "C" {
static thread_local std::string t_error;
const char* npu_last_error() { return t_error.c_str(); }
#define NPU_API_BODY(...) try { __VA_ARGS__; return 0; } catch (const std::exception& e) { t_error = e.what(); return -1; }
typedef void (*npu_kernel)(void* const* buffers, const int64_t* sizes);

// Queue a C kernel on the current stream of the current device; its buffers are handles,
// turned into host addresses by the worker when the kernel runs.
int npu_launch(void* fn, int n_buffers, const uintptr_t* handles, int n_sizes, const int64_t* sizes) {
  NPU_API_BODY(
  std::vector<uintptr_t> h(handles, handles + n_buffers);
  std::vector<int64_t> s(sizes, sizes + n_sizes);
  auto kernel = reinterpret_cast<npu_kernel>(fn);
  int device = npu::t_device;
  npu::queue(device, npu::current_stream(device)).push([kernel, h = std::move(h), s = std::move(s)] {
    std::vector<void*> bufs(h.size());
    for (size_t i = 0; i < h.size(); ++i) bufs[i] = npu::heap().translate(h[i]);
    kernel(bufs.data(), s.data());
  }))
}
// Queue a pause of `ms` milliseconds (tests of asynchrony)
int npu_sleep(double ms) {
  NPU_API_BODY(
  int device = npu::t_device;
  npu::queue(device, npu::current_stream(device)).push([ms] {
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  }))
}
int64_t npu_current_stream(int device) { return npu::current_stream(device); }
int npu_current_device() { return npu::t_device; }
int npu_exchange_device(int device) { int old = npu::t_device; npu::t_device = device; return old; }
int npu_synchronize(int device) {
  NPU_API_BODY(
  ++npu::g_host_syncs;
  for (int s = 0; s < npu::kStreamsPerDevice; ++s) npu::queue(device, s).drain())
}
int64_t npu_host_syncs() { return npu::g_host_syncs.load(); }
int npu_is_device_address(uintptr_t addr) {
  return addr >= npu::heap().base && addr < npu::heap().base + npu::kHeapBytes;
}
}
