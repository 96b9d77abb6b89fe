// The CUDA driver API, loaded at run time from libcuda.so.1 with dlopen, never linked: a
// machine without an NVIDIA driver builds and runs everything else, and asking it for a GPU
// is a clear error. Only the calls rnnc makes, declared here with the driver's C types
// (CUresult is an int, handles are pointers, device pointers 64-bit integers). Every failing
// call becomes a UserError naming the call and the driver's message. One device (the first),
// its primary context; thread-safe as the driver is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rnnc {

class CudaDriver {
public:
  using DevicePointer = uint64_t;
  using Module = void*;
  using Function = void*;

  // The process's driver, loaded and initialised on first use. UserError when there is none:
  // no libcuda.so.1, no device, or a device older than sm_80.
  static CudaDriver& get();
  // Why get() would fail, or empty when it would not (tests skip with this message).
  static std::string unavailableReason();

  const std::string& deviceName() const { return name_; }
  // "sm_80", "sm_90": what rnnc generates for this device (sm_90 for compute capability 9.0
  // and later, sm_80 for 8.x).
  const std::string& gpuArchitecture() const { return architecture_; }
  int multiprocessors() const { return multiprocessors_; }
  bool cooperativeLaunch() const { return cooperative_; }

  Module loadModule(const std::string& ptx) const; // JIT-compiled by the driver for the device
  void unloadModule(Module module) const;
  Function function(Module module, const std::string& name) const;
  int maxActiveBlocksPerMultiprocessor(Function function, int blockSize) const;
  // The most of each multiprocessor's L1/shared memory as shared memory when `function` runs:
  // with its default split, the driver gave a block tile's 34 KB a 64 KB carveout on an H200,
  // room for one block where its registers allow two.
  void preferSharedMemory(Function function) const;

  DevicePointer allocate(size_t bytes) const;
  void free(DevicePointer pointer) const;
  void copyToDevice(DevicePointer to, const void* from, size_t bytes) const;
  void copyToHost(void* to, DevicePointer from, size_t bytes) const;
  void zero(DevicePointer pointer, size_t bytes) const;

  // On the default stream, asynchronously; `arguments` point to each kernel argument.
  void launch(Function function, unsigned grid, unsigned block, void** arguments) const;
  // All blocks resident at once (cuLaunchCooperativeKernel), as a grid barrier needs.
  void launchCooperative(Function function, unsigned grid, unsigned block, void** arguments) const;
  void synchronize() const;

  ~CudaDriver();

private:
  CudaDriver();
  struct Api;
  void check(int result, const char* call) const;

  std::unique_ptr<Api> api_;
  void* context_ = nullptr;
  int device_ = 0;
  std::string name_, architecture_;
  int multiprocessors_ = 0;
  bool cooperative_ = false;
};

// Device memory that frees itself.
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CudaDriver::DevicePointer pointer() const { return pointer_; }
  size_t bytes() const { return bytes_; }

private:
  CudaDriver::DevicePointer pointer_ = 0;
  size_t bytes_ = 0;
};

} // namespace rnnc
