#include "runtime/exec/ObjectLoader.h"

#include "codegen/ObjectBundle.h"
#include "codegen/RunArgs.h"
#include "ir/Error.h"
#include "runtime/exec/Kernels.h"
#include "runtime/exec/PerfJitDump.h"
#include "runtime/exec/WeightPacking.h"
#include "runtime/threads/ThreadTeam.h"

#include <fmt/format.h>

#include <dlfcn.h>
#include <elf.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>

namespace rnnc {
namespace {

[[noreturn]] void refuse(const std::string& why) {
  throw InternalError("loading generated code: " + why);
}

// The object's bytes, read by value (memcpy) and only within its size.
class ObjectBytes {
public:
  explicit ObjectBytes(std::string_view bytes) : bytes_(bytes) {}
  template <typename T> T read(uint64_t offset) const {
    check(offset, sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + offset, sizeof(T));
    return value;
  }
  const char* span(uint64_t offset, uint64_t size) const {
    check(offset, size);
    return bytes_.data() + offset;
  }
  // A NUL-terminated string in the string table at `table`.
  std::string_view string(const Elf64_Shdr& table, uint64_t index) const {
    if (index >= table.sh_size)
      refuse("a name outside its string table");
    const char* first = span(table.sh_offset, table.sh_size) + index;
    const size_t length = strnlen(first, table.sh_size - index);
    if (length == table.sh_size - index)
      refuse("a name without its end in the string table");
    return {first, length};
  }

private:
  void check(uint64_t offset, uint64_t size) const {
    if (offset > bytes_.size() || size > bytes_.size() - offset)
      refuse("the object is truncated");
  }
  std::string_view bytes_;
};

// Where the loaded sections go: code (read+execute), read-only data (with the GOT) and writable
// data, each group on pages of its own so that each gets its protection.
enum Group { kCode, kReadOnly, kWritable, kGroups };

// An indirect jump to an external function, for a 32-bit call that cannot reach it:
// jmp *0(%rip) followed by the address.
constexpr size_t kStubBytes = 16;
void writeStub(char* at, uint64_t target) {
  const unsigned char jump[6] = {0xff, 0x25, 0, 0, 0, 0};
  std::memcpy(at, jump, sizeof(jump));
  std::memcpy(at + sizeof(jump), &target, sizeof(target));
}

bool usesGot(uint32_t type) {
  switch (type) {
  case R_X86_64_GOT32:
  case R_X86_64_GOT64:
  case R_X86_64_GOTPCREL:
  case R_X86_64_GOTPCRELX:
  case R_X86_64_REX_GOTPCRELX:
  case R_X86_64_GOTPCREL64:
    return true;
  default:
    return false;
  }
}

bool usesStub(uint32_t type) {
  return type == R_X86_64_PLT32 || type == R_X86_64_PC32 || type == R_X86_64_PLTOFF64;
}

uint64_t alignUp(uint64_t value, uint64_t alignment) {
  return alignment > 1 ? (value + alignment - 1) / alignment * alignment : value;
}

class Loader {
public:
  Loader(std::string_view object, const ExternalSymbols& symbols)
      : bytes_(object), external_(symbols.begin(), symbols.end()) {}

  LoadedFunction load(const std::string& function) {
    loadAll();
    if (std::optional<LoadedFunction> found = find(function))
      return *found;
    refuse(fmt::format("the object defines no function '{}'", function));
  }

  void loadAll() {
    readHeaders();
    readSymbols();
    planLayout();
    map();
    applyRelocations();
    protect();
    if (const char* perf = std::getenv("RNNC_PERF_MAP"); perf && *perf && *perf != '0')
      writePerfMap();
    if (perfJitDumpRequested())
      for (const Symbol& symbol : symbols_)
        if (symbol.function)
          recordPerfJitCodeLoad(profileName(symbol), reinterpret_cast<const void*>(symbol.address),
                                std::max<uint64_t>(symbol.size, 1));
  }

  std::optional<LoadedFunction> find(const std::string& function) const {
    for (const Symbol& symbol : symbols_)
      if (symbol.function && symbol.name == function)
        return LoadedFunction{reinterpret_cast<void*>(symbol.address), lifetime_};
    return std::nullopt;
  }

  // The functions other objects may call: the global ones (after loadAll).
  void exportFunctions(ExternalSymbols& to) const {
    for (const Symbol& symbol : symbols_)
      if (symbol.function && symbol.global)
        to.emplace_back(std::string(symbol.name), reinterpret_cast<void*>(symbol.address));
  }

  const std::shared_ptr<void>& lifetime() const { return lifetime_; }

private:
  struct Symbol {
    std::string_view name;
    uint16_t section = SHN_UNDEF; // as the object gives them
    uint64_t value = 0;
    uint64_t size = 0;
    uint64_t address = 0;  // once the sections are mapped
    bool external = false; // resolved outside the object
    bool function = false; // a function in a loaded section (not, say, the file's name)
    bool global = false;   // visible to other objects
    bool resolved = false;
    std::optional<size_t> gotSlot, stub;
  };

  void readHeaders() {
    const auto header = bytes_.read<Elf64_Ehdr>(0);
    if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 ||
        header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_ident[EI_DATA] != ELFDATA2LSB)
      refuse("not a 64-bit little-endian ELF object");
    if (header.e_type != ET_REL || header.e_machine != EM_X86_64)
      refuse("not an x86-64 relocatable object");
    if (header.e_shentsize != sizeof(Elf64_Shdr) || header.e_shnum == 0)
      refuse("unexpected section headers");
    for (uint16_t i = 0; i < header.e_shnum; ++i)
      sections_.push_back(bytes_.read<Elf64_Shdr>(header.e_shoff + i * sizeof(Elf64_Shdr)));
  }

  bool loaded(size_t section) const {
    return section < sections_.size() && (sections_[section].sh_flags & SHF_ALLOC) != 0;
  }

  void readSymbols() {
    const Elf64_Shdr* table = nullptr;
    for (const Elf64_Shdr& section : sections_)
      if (section.sh_type == SHT_SYMTAB)
        table = &section;
    if (!table || table->sh_entsize != sizeof(Elf64_Sym) || table->sh_link >= sections_.size())
      refuse("no symbol table");
    const Elf64_Shdr& names = sections_[table->sh_link];
    bytes_.span(table->sh_offset, table->sh_size);
    const uint64_t count = table->sh_size / sizeof(Elf64_Sym);
    for (uint64_t i = 0; i < count; ++i) {
      const auto sym = bytes_.read<Elf64_Sym>(table->sh_offset + i * sizeof(Elf64_Sym));
      Symbol symbol;
      symbol.name = bytes_.string(names, sym.st_name);
      if (sym.st_shndx == SHN_COMMON || sym.st_shndx == SHN_XINDEX)
        refuse(fmt::format("symbol '{}' in a section kind not handled", symbol.name));
      if (ELF64_ST_TYPE(sym.st_info) == STT_TLS)
        refuse(fmt::format("thread-local symbol '{}'", symbol.name));
      symbol.external = sym.st_shndx == SHN_UNDEF && i != 0;
      symbol.function = ELF64_ST_TYPE(sym.st_info) == STT_FUNC && loaded(sym.st_shndx);
      symbol.global = ELF64_ST_BIND(sym.st_info) == STB_GLOBAL;
      symbol.section = sym.st_shndx;
      symbol.value = sym.st_value;
      symbol.size = sym.st_size;
      symbols_.push_back(symbol);
    }
  }

  // Every section the object loads, its GOT slots and stubs, placed in one mapping.
  void planLayout() {
    offsets_.assign(sections_.size(), 0);
    groups_.assign(sections_.size(), kWritable);
    for (size_t i = 0; i < sections_.size(); ++i) {
      const Elf64_Shdr& section = sections_[i];
      if (section.sh_type == SHT_RELA)
        for (const Elf64_Rela& rela : relocations(section)) {
          const size_t index = ELF64_R_SYM(rela.r_info);
          if (index >= symbols_.size())
            refuse("a relocation against a symbol that does not exist");
          Symbol& symbol = symbols_[index];
          const uint32_t type = ELF64_R_TYPE(rela.r_info);
          if (usesGot(type) && !symbol.gotSlot)
            symbol.gotSlot = gotSlots_++;
          if (usesStub(type) && symbol.external && !symbol.stub)
            symbol.stub = stubs_++;
        }
      if (section.sh_type == SHT_REL)
        refuse("relocations without addends (SHT_REL)");
      if (!(section.sh_flags & SHF_ALLOC))
        continue;
      if (section.sh_flags & SHF_TLS)
        refuse("thread-local data");
      // Sizes and alignments that cannot overflow the layout: contents within the object,
      // zero-filled sections and alignments within reason.
      if (section.sh_type != SHT_NOBITS)
        bytes_.span(section.sh_offset, section.sh_size);
      else if (section.sh_size > (uint64_t{1} << 30))
        refuse("a zero-filled section of more than 1 GB");
      if (section.sh_addralign > 4096 || (section.sh_addralign & (section.sh_addralign - 1)))
        refuse("a section alignment that is not a power of two up to 4096");
      if (section.sh_type == SHT_INIT_ARRAY || section.sh_type == SHT_FINI_ARRAY ||
          section.sh_type == SHT_PREINIT_ARRAY)
        refuse("constructors or destructors, which nothing would run");
      const Group group = (section.sh_flags & SHF_EXECINSTR) ? kCode
                          : (section.sh_flags & SHF_WRITE)   ? kWritable
                                                             : kReadOnly;
      groups_[i] = group;
      groupSizes_[group] = alignUp(groupSizes_[group], section.sh_addralign);
      offsets_[i] = groupSizes_[group];
      groupSizes_[group] += section.sh_size;
    }
    groupSizes_[kCode] = alignUp(groupSizes_[kCode], kStubBytes);
    stubOffset_ = groupSizes_[kCode];
    groupSizes_[kCode] += stubs_ * kStubBytes;
    groupSizes_[kReadOnly] = alignUp(groupSizes_[kReadOnly], 8);
    gotOffset_ = groupSizes_[kReadOnly];
    groupSizes_[kReadOnly] += std::max<size_t>(gotSlots_, 1) * 8; // the GOT's address is used
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    uint64_t at = 0;
    for (int g = 0; g < kGroups; ++g) {
      groupStarts_[g] = at;
      at += alignUp(groupSizes_[g], page);
    }
    mappedBytes_ = at;
  }

  std::vector<Elf64_Rela> relocations(const Elf64_Shdr& section) const {
    if (section.sh_entsize != sizeof(Elf64_Rela))
      refuse("relocation entries of an unexpected size");
    const char* first = bytes_.span(section.sh_offset, section.sh_size); // before allocating
    std::vector<Elf64_Rela> out(section.sh_size / sizeof(Elf64_Rela));
    if (!out.empty())
      std::memcpy(out.data(), first, out.size() * sizeof(Elf64_Rela));
    return out;
  }

  char* base(size_t section) const {
    return base_ + groupStarts_[groups_[section]] + offsets_[section];
  }
  uint64_t gotBase() const {
    return reinterpret_cast<uint64_t>(base_ + groupStarts_[kReadOnly] + gotOffset_);
  }
  uint64_t stubAddress(size_t stub) const {
    return reinterpret_cast<uint64_t>(base_ + groupStarts_[kCode] + stubOffset_ +
                                      stub * kStubBytes);
  }

  void map() {
    void* memory =
        mmap(nullptr, mappedBytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED)
      refuse(fmt::format("mapping {} bytes failed: {}", mappedBytes_, std::strerror(errno)));
    base_ = static_cast<char*>(memory);
#if defined(__SANITIZE_ADDRESS__)
    // Fresh memory, whatever AddressSanitizer's shadow still says of these addresses: GCC 12's
    // does not clear it at mmap, and in a child of fork() a range that a thread of the parent
    // had for its stack came back with its frames' poison (the section copies below were
    // reported in Fork.AChildForkedWhileAnotherThreadRunsStillRuns, two CI runs of three).
    ASAN_UNPOISON_MEMORY_REGION(memory, mappedBytes_);
#endif
    const size_t bytes = mappedBytes_;
    lifetime_ = std::shared_ptr<void>(memory, [bytes](void* p) { munmap(p, bytes); });
    for (size_t i = 0; i < sections_.size(); ++i)
      if (loaded(i) && sections_[i].sh_type != SHT_NOBITS && sections_[i].sh_size > 0)
        std::memcpy(base(i), bytes_.span(sections_[i].sh_offset, sections_[i].sh_size),
                    sections_[i].sh_size);
    // Symbols' addresses, now that the sections have theirs.
    for (size_t i = 0; i < symbols_.size(); ++i) {
      Symbol& symbol = symbols_[i];
      const uint16_t section = symbol.section;
      if (section == SHN_ABS) {
        symbol.address = symbol.value;
        symbol.resolved = true;
      } else if (loaded(section)) {
        if (symbol.value > sections_[section].sh_size)
          refuse(fmt::format("symbol '{}' outside its section", symbol.name));
        symbol.address = reinterpret_cast<uint64_t>(base(section)) + symbol.value;
        symbol.resolved = true;
      } else if (symbol.external) {
        resolveExternal(symbol);
      }
      if (symbol.gotSlot)
        std::memcpy(reinterpret_cast<char*>(gotBase()) + *symbol.gotSlot * 8, &symbol.address, 8);
      if (symbol.stub)
        writeStub(reinterpret_cast<char*>(stubAddress(*symbol.stub)), symbol.address);
    }
  }

  void resolveExternal(Symbol& symbol) {
    const std::string name(symbol.name);
    if (name == "_GLOBAL_OFFSET_TABLE_") {
      symbol.address = gotBase();
    } else if (auto it = external_.find(name); it != external_.end()) {
      symbol.address = reinterpret_cast<uint64_t>(it->second);
    } else if (void* found = dlsym(RTLD_DEFAULT, name.c_str())) {
      symbol.address = reinterpret_cast<uint64_t>(found);
    } else {
      return; // an error only if something refers to it
    }
    symbol.resolved = true;
  }

  void applyRelocations() {
    for (const Elf64_Shdr& section : sections_) {
      if (section.sh_type != SHT_RELA || !loaded(section.sh_info))
        continue; // relocations of debug information, which is not loaded
      const size_t target = section.sh_info;
      for (const Elf64_Rela& rela : relocations(section))
        apply(rela, target);
    }
  }

  void apply(const Elf64_Rela& rela, size_t target) {
    const uint32_t type = ELF64_R_TYPE(rela.r_info);
    if (type == R_X86_64_NONE)
      return;
    const Symbol& symbol = symbols_[ELF64_R_SYM(rela.r_info)];
    if (!symbol.resolved)
      refuse(fmt::format("nothing defines '{}'", symbol.name));
    const uint64_t width = type == R_X86_64_64 || type == R_X86_64_PC64 ||
                                   type == R_X86_64_GOTOFF64 || type == R_X86_64_GOTPC64 ||
                                   type == R_X86_64_GOT64 || type == R_X86_64_GOTPCREL64 ||
                                   type == R_X86_64_PLTOFF64
                               ? 8
                               : 4;
    if (rela.r_offset > sections_[target].sh_size ||
        width > sections_[target].sh_size - rela.r_offset)
      refuse("a relocation outside its section");
    char* place = base(target) + rela.r_offset;
    const uint64_t P = reinterpret_cast<uint64_t>(place);
    const uint64_t S = symbol.address, A = static_cast<uint64_t>(rela.r_addend), GOT = gotBase();
    const uint64_t G = symbol.gotSlot ? *symbol.gotSlot * 8 : 0;
    // A call's target: the function itself, or its stub where one was made (an external one).
    const uint64_t L = symbol.stub ? stubAddress(*symbol.stub) : S;
    uint64_t value = 0;
    switch (type) {
    case R_X86_64_64:
      value = S + A;
      break;
    case R_X86_64_PC32:
    case R_X86_64_PLT32:
      value = (fitsSigned32(S + A - P) ? S : L) + A - P;
      break;
    case R_X86_64_PC64:
      value = S + A - P;
      break;
    case R_X86_64_32:
    case R_X86_64_32S:
      value = S + A;
      break;
    case R_X86_64_GOTPCREL:
    case R_X86_64_GOTPCRELX:
    case R_X86_64_REX_GOTPCRELX:
    case R_X86_64_GOTPCREL64:
      value = GOT + G + A - P;
      break;
    case R_X86_64_GOTOFF64:
      value = S + A - GOT;
      break;
    case R_X86_64_GOTPC32:
    case R_X86_64_GOTPC64:
      value = GOT + A - P;
      break;
    case R_X86_64_GOT32:
    case R_X86_64_GOT64:
      value = G + A;
      break;
    case R_X86_64_PLTOFF64:
      value = L + A - GOT;
      break;
    default:
      refuse(fmt::format("relocation type {} (against '{}') is not handled", type, symbol.name));
    }
    if (width == 8) {
      std::memcpy(place, &value, 8);
      return;
    }
    const bool fits =
        type == R_X86_64_32 ? value <= std::numeric_limits<uint32_t>::max() : fitsSigned32(value);
    if (!fits)
      refuse(fmt::format("relocation type {} against '{}' out of 32-bit range", type, symbol.name));
    const uint32_t narrow = static_cast<uint32_t>(value);
    std::memcpy(place, &narrow, 4);
  }

  // A loaded function's name in a profile. Every kernel's entry point has the same name, so each
  // gets a tag from its object's code: the forward and backward of a cell differ.
  std::string profileName(const Symbol& symbol) const {
    uint64_t tag = 14695981039346656037ull; // FNV-1a over the code
    for (const Elf64_Shdr& section : sections_)
      if ((section.sh_flags & SHF_EXECINSTR) && section.sh_type != SHT_NOBITS) {
        const char* code = bytes_.span(section.sh_offset, section.sh_size);
        for (uint64_t i = 0; i < section.sh_size; ++i)
          tag = (tag ^ static_cast<unsigned char>(code[i])) * 1099511628211ull;
      }
    return fmt::format("{}.{:08x}", symbol.name, tag & 0xffffffffu);
  }

  // Names the loaded functions for `perf` (its JIT map, /tmp/perf-PID.map), so that a profile
  // says which generated kernel the time went to.
  void writePerfMap() const {
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    const std::string path = fmt::format("/tmp/perf-{}.map", getpid());
    FILE* map = std::fopen(path.c_str(), "a");
    if (!map)
      return; // profiling aid only: never a reason to fail a load
    for (const Symbol& symbol : symbols_)
      if (symbol.function)
        std::fprintf(map, "%llx %llx %s\n", static_cast<unsigned long long>(symbol.address),
                     static_cast<unsigned long long>(std::max<uint64_t>(symbol.size, 1)),
                     profileName(symbol).c_str());
    std::fclose(map);
  }

  static bool fitsSigned32(uint64_t value) {
    const auto v = static_cast<int64_t>(value);
    return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max();
  }

  void protect() {
    const int protections[kGroups] = {PROT_READ | PROT_EXEC, PROT_READ, PROT_READ | PROT_WRITE};
    for (int g = 0; g < kGroups; ++g) {
      const uint64_t end = g + 1 < kGroups ? groupStarts_[g + 1] : mappedBytes_;
      if (end > groupStarts_[g] &&
          mprotect(base_ + groupStarts_[g], end - groupStarts_[g], protections[g]) != 0)
        refuse(fmt::format("protecting the code's pages failed: {}", std::strerror(errno)));
    }
  }

  ObjectBytes bytes_;
  std::map<std::string, void*, std::less<>> external_;
  std::vector<Elf64_Shdr> sections_;
  std::vector<Symbol> symbols_;
  std::vector<uint64_t> offsets_; // each loaded section's offset in its group
  std::vector<Group> groups_;
  uint64_t groupSizes_[kGroups] = {}, groupStarts_[kGroups] = {};
  uint64_t stubOffset_ = 0, gotOffset_ = 0, mappedBytes_ = 0;
  size_t gotSlots_ = 0, stubs_ = 0;
  char* base_ = nullptr;
  std::shared_ptr<void> lifetime_;
};

} // namespace

LoadedFunction loadObject(std::string_view object, const std::string& function,
                          const ExternalSymbols& symbols) {
  if (!codegen::isObjectBundle(object))
    return Loader(object, symbols).load(function);
  // The parts in order, each resolving calls into the ones before; the code of all of them
  // stays mapped while the function returned is held.
  ExternalSymbols known = symbols;
  auto lifetimes = std::make_shared<std::vector<std::shared_ptr<void>>>();
  std::optional<LoadedFunction> found;
  for (std::string_view part : codegen::objectsOfBundle(object)) {
    Loader loader(part, known);
    loader.loadAll();
    lifetimes->push_back(loader.lifetime());
    loader.exportFunctions(known);
    if (std::optional<LoadedFunction> here = loader.find(function))
      found = here;
  }
  if (!found)
    refuse(fmt::format("no part of the object defines a function '{}'", function));
  return {found->address, std::shared_ptr<void>(lifetimes, lifetimes.get())};
}

LoadedFunction loadGeneratedCode(std::string_view object, const std::string& function) {
  static const ExternalSymbols helpers = {
      {codegen::kGemmSymbol, reinterpret_cast<void*>(&rnnc_gemm)},
      {codegen::kLayerNormSymbol, reinterpret_cast<void*>(&rnnc_layernorm)},
      {codegen::kLayerNormGradSymbol, reinterpret_cast<void*>(&rnnc_layernorm_grad)},
      {codegen::kDropoutMaskSymbol, reinterpret_cast<void*>(&rnnc_dropout_mask)},
      {codegen::kBarrierSymbol, reinterpret_cast<void*>(&rnnc_barrier)},
      {codegen::kShareStartSymbol, reinterpret_cast<void*>(&rnnc_share_start)},
      {codegen::kShareClockSymbol, reinterpret_cast<void*>(&rnnc_share_clock)},
      {codegen::kPackWeightsSymbol, reinterpret_cast<void*>(&rnnc_pack_weights)},
      {codegen::kTileSplitSymbol, reinterpret_cast<void*>(&rnnc_tile_split)},
      {codegen::kTileUnitStartSymbol, reinterpret_cast<void*>(&rnnc_tile_unit_start)}};
  return loadObject(object, function, helpers);
}

} // namespace rnnc
