#include "runtime/gpu/CudaDriver.h"

#include "ir/Error.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>

namespace rnnc {

// The driver's entry points, by the names libcuda.so exports (the _v2 ones where the API's
// macros map the plain name to them).
struct CudaDriver::Api {
  void* library = nullptr;
  int (*cuInit)(unsigned);
  int (*cuDeviceGetCount)(int*);
  int (*cuDeviceGet)(int*, int);
  int (*cuDeviceGetName)(char*, int, int);
  int (*cuDeviceGetAttribute)(int*, int, int);
  int (*cuDevicePrimaryCtxRetain)(void**, int);
  int (*cuCtxSetCurrent)(void*);
  int (*cuCtxSynchronize)();
  int (*cuModuleLoadDataEx)(void**, const void*, unsigned, int*, void**);
  int (*cuModuleUnload)(void*);
  int (*cuModuleGetFunction)(void**, void*, const char*);
  int (*cuMemAlloc)(uint64_t*, size_t);
  int (*cuMemFree)(uint64_t);
  int (*cuMemcpyHtoD)(uint64_t, const void*, size_t);
  int (*cuMemcpyDtoH)(void*, uint64_t, size_t);
  int (*cuMemsetD8)(uint64_t, unsigned char, size_t);
  int (*cuLaunchKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        void*, void**, void**);
  int (*cuLaunchCooperativeKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, unsigned, void*, void**);
  int (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, void*, int, size_t);
  int (*cuFuncSetAttribute)(void*, int, int);
  int (*cuGetErrorString)(int, const char**);
};

namespace {

// cuDeviceGetAttribute's attributes and cuModuleLoadDataEx's options (cuda.h's values).
constexpr int kMultiprocessorCount = 16;
constexpr int kComputeCapabilityMajor = 75;
constexpr int kComputeCapabilityMinor = 76;
constexpr int kCooperativeLaunch = 95;
constexpr int kPreferredSharedMemoryCarveout = 9; // a function attribute
constexpr int kCarveoutMaxShared = 100;
constexpr int kJitErrorLogBuffer = 5;
constexpr int kJitErrorLogBufferSize = 6;

struct Loaded {
  std::once_flag once;
  std::string failure; // why there is no driver; empty once it is loaded
  std::unique_ptr<CudaDriver> driver;
};

Loaded& loaded() {
  static Loaded state;
  return state;
}

template <class F> void resolve(void* library, F& function, const char* name) {
  void* symbol = dlsym(library, name);
  if (!symbol)
    throw UserError(fmt::format("the CUDA driver (libcuda.so.1) lacks {}: too old a driver", name));
  function = reinterpret_cast<F>(symbol);
}

} // namespace

CudaDriver::CudaDriver() = default;
CudaDriver::~CudaDriver() = default;

void CudaDriver::check(int result, const char* call) const {
  if (result == 0)
    return;
  const char* message = nullptr;
  if (api_ && api_->cuGetErrorString)
    api_->cuGetErrorString(result, &message);
  throw UserError(fmt::format("CUDA: {} failed: {} (error {})", call,
                              message ? message : "unknown error", result));
}

CudaDriver& CudaDriver::get() {
  Loaded& state = loaded();
  std::call_once(state.once, [&] {
    try {
      void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
      if (!library)
        throw UserError("no CUDA driver on this machine (libcuda.so.1 could not be loaded): "
                        "--device cuda needs an NVIDIA GPU and its driver");
      auto driver = std::unique_ptr<CudaDriver>(new CudaDriver);
      driver->api_ = std::make_unique<Api>();
      Api* api = driver->api_.get();
      api->library = library;
      resolve(library, api->cuInit, "cuInit");
      resolve(library, api->cuDeviceGetCount, "cuDeviceGetCount");
      resolve(library, api->cuDeviceGet, "cuDeviceGet");
      resolve(library, api->cuDeviceGetName, "cuDeviceGetName");
      resolve(library, api->cuDeviceGetAttribute, "cuDeviceGetAttribute");
      resolve(library, api->cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
      resolve(library, api->cuCtxSetCurrent, "cuCtxSetCurrent");
      resolve(library, api->cuCtxSynchronize, "cuCtxSynchronize");
      resolve(library, api->cuModuleLoadDataEx, "cuModuleLoadDataEx");
      resolve(library, api->cuModuleUnload, "cuModuleUnload");
      resolve(library, api->cuModuleGetFunction, "cuModuleGetFunction");
      resolve(library, api->cuMemAlloc, "cuMemAlloc_v2");
      resolve(library, api->cuMemFree, "cuMemFree_v2");
      resolve(library, api->cuMemcpyHtoD, "cuMemcpyHtoD_v2");
      resolve(library, api->cuMemcpyDtoH, "cuMemcpyDtoH_v2");
      resolve(library, api->cuMemsetD8, "cuMemsetD8_v2");
      resolve(library, api->cuLaunchKernel, "cuLaunchKernel");
      resolve(library, api->cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel");
      resolve(library, api->cuOccupancyMaxActiveBlocksPerMultiprocessor,
              "cuOccupancyMaxActiveBlocksPerMultiprocessor");
      resolve(library, api->cuFuncSetAttribute, "cuFuncSetAttribute");
      resolve(library, api->cuGetErrorString, "cuGetErrorString");
      driver->check(api->cuInit(0), "cuInit");
      int count = 0;
      driver->check(api->cuDeviceGetCount(&count), "cuDeviceGetCount");
      if (count == 0)
        throw UserError("the CUDA driver finds no GPU on this machine");
      driver->check(api->cuDeviceGet(&driver->device_, 0), "cuDeviceGet");
      char name[256] = {};
      driver->check(api->cuDeviceGetName(name, sizeof name - 1, driver->device_),
                    "cuDeviceGetName");
      driver->name_ = name;
      int major = 0, minor = 0, cooperative = 0;
      driver->check(api->cuDeviceGetAttribute(&major, kComputeCapabilityMajor, driver->device_),
                    "cuDeviceGetAttribute");
      driver->check(api->cuDeviceGetAttribute(&minor, kComputeCapabilityMinor, driver->device_),
                    "cuDeviceGetAttribute");
      driver->check(api->cuDeviceGetAttribute(&driver->multiprocessors_, kMultiprocessorCount,
                                              driver->device_),
                    "cuDeviceGetAttribute");
      driver->check(api->cuDeviceGetAttribute(&cooperative, kCooperativeLaunch, driver->device_),
                    "cuDeviceGetAttribute");
      driver->cooperative_ = cooperative != 0;
      if (major < 8)
        throw UserError(fmt::format("GPU '{}' has compute capability {}.{}; rnnc generates code "
                                    "for sm_80 and later",
                                    driver->name_, major, minor));
      driver->architecture_ = major >= 9 ? "sm_90" : "sm_80";
      driver->check(api->cuDevicePrimaryCtxRetain(&driver->context_, driver->device_),
                    "cuDevicePrimaryCtxRetain");
      driver->check(api->cuCtxSetCurrent(driver->context_), "cuCtxSetCurrent");
      state.driver = std::move(driver);
    } catch (const std::exception& e) {
      state.failure = e.what();
    }
  });
  if (!state.driver)
    throw UserError(state.failure);
  // The primary context is current on the thread that loaded the driver; make it current here.
  state.driver->check(state.driver->api_->cuCtxSetCurrent(state.driver->context_),
                      "cuCtxSetCurrent");
  return *state.driver;
}

std::string CudaDriver::unavailableReason() {
  try {
    get();
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

CudaDriver::Module CudaDriver::loadModule(const std::string& ptx) const {
  std::vector<char> log(8192, '\0');
  int options[] = {kJitErrorLogBuffer, kJitErrorLogBufferSize};
  void* values[] = {log.data(), reinterpret_cast<void*>(log.size() - 1)};
  Module module = nullptr;
  int result = api_->cuModuleLoadDataEx(&module, ptx.c_str(), 2, options, values);
  if (result != 0) {
    const char* message = nullptr;
    api_->cuGetErrorString(result, &message);
    throw UserError(fmt::format("CUDA: the driver could not load the generated PTX: {}: {}",
                                message ? message : "error " + std::to_string(result), log.data()));
  }
  return module;
}

void CudaDriver::unloadModule(Module module) const {
  api_->cuModuleUnload(module);
}

CudaDriver::Function CudaDriver::function(Module module, const std::string& name) const {
  Function f = nullptr;
  check(api_->cuModuleGetFunction(&f, module, name.c_str()), "cuModuleGetFunction");
  return f;
}

void CudaDriver::preferSharedMemory(Function function) const {
  check(api_->cuFuncSetAttribute(function, kPreferredSharedMemoryCarveout, kCarveoutMaxShared),
        "cuFuncSetAttribute");
}

int CudaDriver::maxActiveBlocksPerMultiprocessor(Function function, int blockSize) const {
  int blocks = 0;
  check(api_->cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, function, blockSize, 0),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks;
}

CudaDriver::DevicePointer CudaDriver::allocate(size_t bytes) const {
  DevicePointer pointer = 0;
  check(api_->cuMemAlloc(&pointer, bytes == 0 ? 4 : bytes), "cuMemAlloc");
  return pointer;
}

void CudaDriver::free(DevicePointer pointer) const {
  api_->cuMemFree(pointer);
}

void CudaDriver::copyToDevice(DevicePointer to, const void* from, size_t bytes) const {
  if (bytes > 0)
    check(api_->cuMemcpyHtoD(to, from, bytes), "cuMemcpyHtoD");
}

void CudaDriver::copyToHost(void* to, DevicePointer from, size_t bytes) const {
  if (bytes > 0)
    check(api_->cuMemcpyDtoH(to, from, bytes), "cuMemcpyDtoH");
}

void CudaDriver::zero(DevicePointer pointer, size_t bytes) const {
  if (bytes > 0)
    check(api_->cuMemsetD8(pointer, 0, bytes), "cuMemsetD8");
}

void CudaDriver::launch(Function function, unsigned grid, unsigned block, void** arguments) const {
  check(api_->cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0, nullptr, arguments, nullptr),
        "cuLaunchKernel");
}

void CudaDriver::launchCooperative(Function function, unsigned grid, unsigned block,
                                   void** arguments) const {
  check(api_->cuLaunchCooperativeKernel(function, grid, 1, 1, block, 1, 1, 0, nullptr, arguments),
        "cuLaunchCooperativeKernel");
}

void CudaDriver::synchronize() const {
  check(api_->cuCtxSynchronize(), "cuCtxSynchronize");
}

DeviceBuffer::DeviceBuffer(size_t bytes)
    : pointer_(CudaDriver::get().allocate(bytes)), bytes_(bytes) {}

DeviceBuffer::~DeviceBuffer() {
  if (pointer_)
    CudaDriver::get().free(pointer_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : pointer_(other.pointer_), bytes_(other.bytes_) {
  other.pointer_ = 0;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (pointer_)
      CudaDriver::get().free(pointer_);
    pointer_ = other.pointer_;
    bytes_ = other.bytes_;
    other.pointer_ = 0;
    other.bytes_ = 0;
  }
  return *this;
}

} // namespace rnnc
