#include "runtime/exec/PerfJitDump.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <vector>

namespace rnnc {
namespace {

// The layout perf reads (jitdump-specification.txt, version 1), in the host's byte order.
constexpr uint32_t kMagic = 0x4A695444; // "JiTD"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kCodeLoad = 0; // JIT_CODE_LOAD

struct FileHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t totalSize; // of this header
  uint32_t elfMach;
  uint32_t pad1;
  uint32_t pid;
  uint64_t timestamp;
  uint64_t flags;
};

struct CodeLoadRecord { // followed by the name (NUL-terminated) and the code
  uint32_t id;
  uint32_t totalSize; // of the record, name and code included
  uint64_t timestamp;
  uint32_t pid;
  uint32_t tid;
  uint64_t vma;
  uint64_t codeAddress;
  uint64_t codeSize;
  uint64_t codeIndex; // unique and increasing per load
};

static_assert(sizeof(FileHeader) == 40 && sizeof(CodeLoadRecord) == 56);

// perf matches records to samples by time: its clock must be this one (`perf record -k mono`).
uint64_t monotonicNanoseconds() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec);
}

bool writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written < 0 && errno == EINTR)
      continue;
    if (written <= 0)
      return false;
    data += written;
    size -= static_cast<size_t>(written);
  }
  return true;
}

class DumpFile {
public:
  void append(std::string_view name, const void* code, uint64_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    // First use, a forked child (a file of its own), or the file deleted since (a test that
    // reads and removes it, then loads more): a new file. After a failure, none.
    struct stat status {};
    if (pid_ != ::getpid() || (fd_ >= 0 && ::fstat(fd_, &status) == 0 && status.st_nlink == 0))
      open();
    if (fd_ < 0)
      return;
    CodeLoadRecord record{};
    record.id = kCodeLoad;
    record.totalSize = static_cast<uint32_t>(sizeof record + name.size() + 1 + size);
    record.timestamp = monotonicNanoseconds();
    record.pid = static_cast<uint32_t>(pid_);
    record.tid = static_cast<uint32_t>(::syscall(SYS_gettid));
    record.vma = record.codeAddress = reinterpret_cast<uintptr_t>(code);
    record.codeSize = size;
    record.codeIndex = nextIndex_++;
    std::vector<char> bytes(record.totalSize);
    std::memcpy(bytes.data(), &record, sizeof record);
    std::memcpy(bytes.data() + sizeof record, name.data(), name.size());
    bytes[sizeof record + name.size()] = '\0';
    std::memcpy(bytes.data() + sizeof record + name.size() + 1, code, size);
    if (!writeAll(fd_, bytes.data(), bytes.size()))
      fail("cannot write");
  }

private:
  void open() {
    if (fd_ >= 0)
      ::close(fd_); // the parent's, inherited
    fd_ = -1;
    pid_ = ::getpid();
    const std::string path = perfJitDumpPath();
    // A name anyone can predict in /tmp: never follow a link there, never write another's file.
    ::unlink(path.c_str());
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd_ < 0)
      return fail("cannot create");
    FileHeader header{kMagic,
                      kVersion,
                      sizeof(FileHeader),
                      EM_X86_64,
                      0,
                      static_cast<uint32_t>(pid_),
                      monotonicNanoseconds(),
                      0};
    if (!writeAll(fd_, reinterpret_cast<const char*>(&header), sizeof header))
      return fail("cannot write");
    // perf records executable mappings of files: this one is how it finds the dump. It stays
    // mapped for the life of the process.
    if (::mmap(nullptr, static_cast<size_t>(::sysconf(_SC_PAGESIZE)), PROT_READ | PROT_EXEC,
               MAP_PRIVATE, fd_, 0) == MAP_FAILED)
      fail("cannot map (perf would not find it)");
  }

  void fail(const char* what) {
    if (!reported_)
      std::fprintf(stderr, "rnnc: RNNC_PERF_JITDUMP: %s %s: %s\n", what, perfJitDumpPath().c_str(),
                   std::strerror(errno));
    reported_ = true;
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = -1;
  }

  std::mutex mutex_;
  int fd_ = -1;
  pid_t pid_ = 0; // the process the file is for
  uint64_t nextIndex_ = 0;
  bool reported_ = false;
};

DumpFile& dumpFile() {
  static DumpFile* file = new DumpFile; // never destroyed: code may load while the process exits
  return *file;
}

} // namespace

bool perfJitDumpRequested() {
  const char* value = std::getenv("RNNC_PERF_JITDUMP");
  return value && *value && std::strcmp(value, "0") != 0;
}

std::string perfJitDumpPath() {
  return "/tmp/jit-" + std::to_string(::getpid()) + ".dump";
}

void recordPerfJitCodeLoad(std::string_view name, const void* code, uint64_t size) {
  dumpFile().append(name, code, size);
}

} // namespace rnnc
