#include "codegen/Jit.h"

#include "codegen/LLVMError.h"
#include "codegen/LLVMHeaders.h"

#include <mutex>

namespace rnnc::codegen {

struct Jit::Impl {
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::mutex mutex;
  int nextDylib = 0;
};

Jit::Jit(const std::vector<std::pair<std::string, void*>>& symbols)
    : impl_(std::make_shared<Impl>()) {
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  impl_->jit = unwrap(llvm::orc::LLJITBuilder().create(), "creating the JIT");
  llvm::orc::SymbolMap map;
  for (const auto& [name, address] : symbols)
    map[impl_->jit->mangleAndIntern(name)] = {llvm::orc::ExecutorAddr::fromPtr(address),
                                              llvm::JITSymbolFlags::Exported |
                                                  llvm::JITSymbolFlags::Callable};
  check(impl_->jit->getMainJITDylib().define(llvm::orc::absoluteSymbols(std::move(map))),
        "defining runtime symbols");
}

Jit::~Jit() = default;

Jit::Loaded Jit::load(const std::string& objectFile, const std::string& functionName) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  llvm::orc::LLJIT& jit = *impl_->jit;
  std::string dylibName = "rnnc_cell_" + std::to_string(impl_->nextDylib++);
  llvm::orc::JITDylib& dylib = unwrap(jit.createJITDylib(dylibName), "creating a JITDylib");
  dylib.addToLinkOrder(jit.getMainJITDylib());
  auto buffer = llvm::MemoryBuffer::getMemBufferCopy(objectFile, functionName);
  check(jit.addObjectFile(dylib, std::move(buffer)), "adding compiled code");
  llvm::orc::ExecutorAddr address =
      unwrap(jit.lookup(dylib, functionName), "looking up the compiled function");

  Loaded loaded;
  loaded.address = address.toPtr<void*>();
  // Keep the JIT alive as long as any of its code can still be called.
  std::shared_ptr<Impl> impl = impl_;
  llvm::orc::JITDylib* dylibPtr = &dylib;
  loaded.lifetime = std::shared_ptr<void>(nullptr, [impl, dylibPtr](void*) {
    std::lock_guard<std::mutex> lock(impl->mutex);
    llvm::consumeError(impl->jit->getExecutionSession().removeJITDylib(*dylibPtr));
  });
  return loaded;
}

} // namespace rnnc::codegen
