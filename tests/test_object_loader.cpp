// runtime/exec/ObjectLoader.h on objects built here by hand, byte by byte (a small ELF writer and
// hand-assembled x86-64), so that each relocation kind is checked by running the code it
// patches: calls to an external function out of 32-bit reach (through a stub), data read
// through the GOT and RIP-relative, the large code model's GOT-relative sequences (what LLVM
// emits for the JIT), writable data. Every compiled cell in the other tests also loads through
// it. And what it must refuse: other files, other machines, truncated or damaged objects,
// names nothing defines, relocation kinds it does not handle.
#include "codegen/ObjectBundle.h"
#include "ir/Error.h"
#include "runtime/exec/ObjectLoader.h"

#include <gtest/gtest.h>

#include <elf.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace rnnc {
namespace loader_test {

// A relocatable x86-64 ELF object: sections, symbols (the null one first, then every symbol as
// global), relocations with addends.
class ElfWriter {
public:
  int section(const std::string& name, uint32_t type, uint64_t flags, std::string bytes,
              uint64_t align = 16) {
    sections_.push_back({name, type, flags, std::move(bytes), align});
    return static_cast<int>(sections_.size()); // index 0 is the null section
  }
  int symbol(const std::string& name, int section, uint64_t value, unsigned type) {
    symbols_.push_back({name, section, value, type});
    return static_cast<int>(symbols_.size()); // index 0 is the null symbol
  }
  void relocate(int section, uint64_t offset, int symbol, uint32_t type, int64_t addend) {
    relocations_.push_back({section, offset, symbol, type, addend});
  }
  uint16_t machine = EM_X86_64;

  std::string build() const {
    std::string out(sizeof(Elf64_Ehdr), '\0');
    std::vector<Elf64_Shdr> headers(1); // the null section
    std::string names(1, '\0');         // .shstrtab
    auto name = [&](const std::string& n) {
      const auto at = static_cast<uint32_t>(names.size());
      names += n + '\0';
      return at;
    };
    auto place = [&](const std::string& bytes, uint64_t align) {
      while (out.size() % align)
        out += '\0';
      const uint64_t at = out.size();
      out += bytes;
      return at;
    };
    for (const Section& s : sections_) {
      Elf64_Shdr h{};
      h.sh_name = name(s.name);
      h.sh_type = s.type;
      h.sh_flags = s.flags;
      h.sh_addralign = s.align;
      h.sh_size = s.bytes.size();
      h.sh_offset = place(s.bytes, s.align);
      headers.push_back(h);
    }
    const int symtabIndex = static_cast<int>(sections_.size() + 1 + sectionsWithRelocations());
    const int strtabIndex = symtabIndex + 1;
    for (int target = 1; target <= static_cast<int>(sections_.size()); ++target) {
      std::string bytes;
      for (const Relocation& r : relocations_)
        if (r.section == target) {
          Elf64_Rela rela{r.offset, ELF64_R_INFO(r.symbol, r.type), r.addend};
          bytes.append(reinterpret_cast<const char*>(&rela), sizeof(rela));
        }
      if (bytes.empty())
        continue;
      Elf64_Shdr h{};
      h.sh_name = name(".rela" + sections_[target - 1].name);
      h.sh_type = SHT_RELA;
      h.sh_link = symtabIndex;
      h.sh_info = target;
      h.sh_entsize = sizeof(Elf64_Rela);
      h.sh_addralign = 8;
      h.sh_size = bytes.size();
      h.sh_offset = place(bytes, 8);
      headers.push_back(h);
    }
    std::string strings(1, '\0'), table(sizeof(Elf64_Sym), '\0');
    for (const Symbol& s : symbols_) {
      Elf64_Sym sym{};
      sym.st_name = static_cast<uint32_t>(strings.size());
      strings += s.name + '\0';
      sym.st_info = ELF64_ST_INFO(STB_GLOBAL, s.type);
      sym.st_shndx = static_cast<uint16_t>(s.section);
      sym.st_value = s.value;
      table.append(reinterpret_cast<const char*>(&sym), sizeof(sym));
    }
    Elf64_Shdr symtab{};
    symtab.sh_name = name(".symtab");
    symtab.sh_type = SHT_SYMTAB;
    symtab.sh_link = strtabIndex;
    symtab.sh_info = 1; // the first global symbol
    symtab.sh_entsize = sizeof(Elf64_Sym);
    symtab.sh_addralign = 8;
    symtab.sh_size = table.size();
    symtab.sh_offset = place(table, 8);
    headers.push_back(symtab);
    auto stringTable = [&](const char* tableName, const std::string& text) {
      Elf64_Shdr h{};
      h.sh_name = name(tableName);
      h.sh_type = SHT_STRTAB;
      h.sh_addralign = 1;
      h.sh_size = text.size();
      h.sh_offset = place(text, 1);
      headers.push_back(h);
    };
    stringTable(".strtab", strings);
    stringTable(".shstrtab", names); // its own name added first: the last string it holds

    Elf64_Ehdr header{};
    std::memcpy(header.e_ident, ELFMAG, SELFMAG);
    header.e_ident[EI_CLASS] = ELFCLASS64;
    header.e_ident[EI_DATA] = ELFDATA2LSB;
    header.e_ident[EI_VERSION] = EV_CURRENT;
    header.e_type = ET_REL;
    header.e_machine = machine;
    header.e_version = EV_CURRENT;
    header.e_ehsize = sizeof(Elf64_Ehdr);
    header.e_shentsize = sizeof(Elf64_Shdr);
    header.e_shnum = static_cast<uint16_t>(headers.size());
    header.e_shstrndx = static_cast<uint16_t>(headers.size() - 1);
    header.e_shoff = place(std::string(reinterpret_cast<const char*>(headers.data()),
                                       headers.size() * sizeof(Elf64_Shdr)),
                           8);
    std::memcpy(out.data(), &header, sizeof(header));
    return out;
  }

private:
  struct Section {
    std::string name;
    uint32_t type;
    uint64_t flags;
    std::string bytes;
    uint64_t align;
  };
  struct Symbol {
    std::string name;
    int section;
    uint64_t value;
    unsigned type;
  };
  struct Relocation {
    int section;
    uint64_t offset;
    int symbol;
    uint32_t type;
    int64_t addend;
  };
  size_t sectionsWithRelocations() const {
    size_t n = 0;
    for (int target = 1; target <= static_cast<int>(sections_.size()); ++target)
      for (const Relocation& r : relocations_)
        if (r.section == target) {
          ++n;
          break;
        }
    return n;
  }
  std::vector<Section> sections_;
  std::vector<Symbol> symbols_;
  std::vector<Relocation> relocations_;
};

std::string bytes(std::initializer_list<unsigned> values) {
  std::string out;
  for (unsigned v : values)
    out += static_cast<char>(v);
  return out;
}
std::string int64Bytes(std::initializer_list<int64_t> values) {
  std::string out;
  for (int64_t v : values)
    out.append(reinterpret_cast<const char*>(&v), sizeof(v));
  return out;
}

constexpr uint64_t kCode = SHF_ALLOC | SHF_EXECINSTR;
using Function = int64_t (*)();

int64_t fortyTwo() {
  return 42;
}

// entry: sub rsp, 8; call external; add rsp, 8; ret. The call's 32-bit displacement (at 5)
// cannot reach this test binary from wherever the loader maps the code (PIE binaries and mmap
// are terabytes apart): it must go through a stub.
std::string objectCalling(uint32_t callRelocation, const std::string& external) {
  ElfWriter elf;
  const int text =
      elf.section(".text", SHT_PROGBITS, kCode,
                  bytes({0x48, 0x83, 0xec, 0x08, 0xe8, 0, 0, 0, 0, 0x48, 0x83, 0xc4, 0x08, 0xc3}));
  elf.symbol("entry", text, 0, STT_FUNC);
  const int callee = elf.symbol(external, SHN_UNDEF, 0, STT_NOTYPE);
  elf.relocate(text, 5, callee, callRelocation, -4);
  return elf.build();
}

TEST(ObjectLoader, CallsAFarExternalFunctionThroughAStub) {
  for (uint32_t type : {R_X86_64_PLT32, R_X86_64_PC32}) {
    LoadedFunction f = loadObject(objectCalling(type, "rnnc_test_external"), "entry",
                                  {{"rnnc_test_external", reinterpret_cast<void*>(&fortyTwo)}});
    EXPECT_EQ(reinterpret_cast<Function>(f.address)(), 42) << "relocation type " << type;
  }
}

// A bundle (codegen/ObjectBundle.h) loads part after part: the second part's call to a function
// the first defines goes to it, as a cell's setup part calls its loop part.
TEST(ObjectLoader, ABundlesPartsCallTheFunctionsOfEarlierParts) {
  ElfWriter callee;
  // mov eax, 42; ret
  const int text =
      callee.section(".text", SHT_PROGBITS, kCode, bytes({0xb8, 0x2a, 0x00, 0x00, 0x00, 0xc3}));
  callee.symbol("rnnc_test_answer", text, 0, STT_FUNC);
  const std::string bundle =
      codegen::bundleObjects({callee.build(), objectCalling(R_X86_64_PLT32, "rnnc_test_answer")});
  LoadedFunction f = loadObject(bundle, "entry", {});
  EXPECT_EQ(reinterpret_cast<Function>(f.address)(), 42);
  // The earlier part's functions are found by name too.
  EXPECT_EQ(reinterpret_cast<Function>(loadObject(bundle, "rnnc_test_answer", {}).address)(), 42);
  // In the other order the call has nothing to go to.
  EXPECT_THROW(loadObject(codegen::bundleObjects(
                              {objectCalling(R_X86_64_PLT32, "rnnc_test_answer"), callee.build()}),
                          "entry", {}),
               InternalError);
  EXPECT_THROW(loadObject(bundle, "absent", {}), InternalError);
  // Damaged bundles are errors, never crashes: cut anywhere, or with bytes after the last part.
  for (size_t cut = 8; cut < bundle.size(); cut += 7)
    EXPECT_THROW(loadObject(bundle.substr(0, cut), "entry", {}), InternalError) << cut;
  EXPECT_THROW(loadObject(bundle + "x", "entry", {}), InternalError);
  std::string huge = bundle;
  huge[23] = '\x7f'; // the first part's size's top byte: far past the end
  EXPECT_THROW(loadObject(huge, "entry", {}), InternalError);
}

TEST(ObjectLoader, FindsProcessFunctionsByName) {
  // strlen from the C library, found in the process: called with whatever rdi holds, so only
  // that the symbol resolves is checked, not the call.
  EXPECT_NO_THROW(loadObject(objectCalling(R_X86_64_PLT32, "strlen"), "entry", {}));
}

// With RNNC_PERF_MAP set, each loaded function is named in perf's JIT map (/tmp/perf-PID.map,
// "address size name" lines), so that a profile names generated kernels.
TEST(ObjectLoader, NamesLoadedFunctionsInPerfsMapWhenAsked) {
  const std::string path = "/tmp/perf-" + std::to_string(getpid()) + ".map";
  setenv("RNNC_PERF_MAP", "1", 1);
  LoadedFunction f = loadObject(objectCalling(R_X86_64_PLT32, "rnnc_test_external"), "entry",
                                {{"rnnc_test_external", reinterpret_cast<void*>(&fortyTwo)}});
  unsetenv("RNNC_PERF_MAP");
  std::ifstream map(path);
  ASSERT_TRUE(map) << path;
  char address[32];
  std::snprintf(address, sizeof address, "%llx ",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(f.address)));
  bool named = false;
  for (std::string line; std::getline(map, line);)
    named = named || (line.rfind(address, 0) == 0 && line.find(" entry.") != std::string::npos);
  EXPECT_TRUE(named) << "no line for entry at " << address << " in " << path;
  std::remove(path.c_str());
}

// With RNNC_PERF_JITDUMP set, each loaded function is a code-load record of perf's jitdump
// (/tmp/jit-PID.dump): its name, address and size, and its code as it lies in memory, relocated;
// the file mapped executable, which is how `perf record` finds it. Two loads: two records, in
// order.
TEST(ObjectLoader, WritesPerfsJitDumpOfTheLoadedCodeWhenAsked) {
  setenv("RNNC_PERF_JITDUMP", "1", 1);
  const ExternalSymbols external{{"rnnc_test_external", reinterpret_cast<void*>(&fortyTwo)}};
  LoadedFunction first =
      loadObject(objectCalling(R_X86_64_PLT32, "rnnc_test_external"), "entry", external);
  LoadedFunction second =
      loadObject(objectCalling(R_X86_64_PC32, "rnnc_test_external"), "entry", external);
  unsetenv("RNNC_PERF_JITDUMP");
  EXPECT_EQ(reinterpret_cast<Function>(first.address)(), 42);

  const std::string path = "/tmp/jit-" + std::to_string(getpid()) + ".dump";
  std::ifstream file(path, std::ios::binary);
  ASSERT_TRUE(file) << path;
  const std::string dump((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    std::memcpy(&v, dump.data() + at, 4);
    return v;
  };
  auto u64 = [&](size_t at) {
    uint64_t v = 0;
    std::memcpy(&v, dump.data() + at, 8);
    return v;
  };
  ASSERT_GE(dump.size(), 40u);
  EXPECT_EQ(u32(0), 0x4A695444u); // "JiTD"
  EXPECT_EQ(u32(4), 1u);          // version
  EXPECT_EQ(u32(8), 40u);         // header size
  EXPECT_EQ(u32(12), static_cast<uint32_t>(EM_X86_64));
  EXPECT_EQ(u32(20), static_cast<uint32_t>(getpid()));

  struct Load {
    uint64_t timestamp, address, size, index;
    std::string name;
  };
  std::vector<Load> loads;
  for (size_t at = 40; at + 16 <= dump.size();) {
    const uint32_t id = u32(at), size = u32(at + 4);
    ASSERT_GE(size, 16u);
    ASSERT_LE(at + size, dump.size());
    if (id == 0) { // JIT_CODE_LOAD: pid, tid, vma, code address, size, index, name, code
      Load load{u64(at + 8), u64(at + 32), u64(at + 40), u64(at + 48),
                std::string(dump.data() + at + 56)};
      EXPECT_EQ(u32(at + 16), static_cast<uint32_t>(getpid()));
      EXPECT_EQ(u64(at + 24), load.address); // vma
      const size_t code = at + 56 + load.name.size() + 1;
      EXPECT_EQ(code + load.size, at + size);
      EXPECT_EQ(
          std::memcmp(dump.data() + code, reinterpret_cast<const void*>(load.address), load.size),
          0)
          << load.name << ": the record's code is not what lies in memory";
      loads.push_back(load);
    }
    at += size;
  }
  std::vector<Load> entries;
  for (const Load& load : loads)
    if (load.name.rfind("entry.", 0) == 0)
      entries.push_back(load);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].address, reinterpret_cast<uintptr_t>(first.address));
  EXPECT_EQ(entries[1].address, reinterpret_cast<uintptr_t>(second.address));
  EXPECT_LT(entries[0].index, entries[1].index);
  EXPECT_LE(entries[0].timestamp, entries[1].timestamp);

  std::ifstream maps("/proc/self/maps");
  bool mappedExecutable = false;
  for (std::string line; std::getline(maps, line);)
    mappedExecutable = mappedExecutable || (line.find(path) != std::string::npos &&
                                            line.find(" r-xp ") != std::string::npos);
  EXPECT_TRUE(mappedExecutable) << path << " is not mapped executable: perf would not find it";
  std::remove(path.c_str());
}

TEST(ObjectLoader, ReadsConstantsThroughTheGotAndRipRelative) {
  ElfWriter elf;
  const int rodata = elf.section(".rodata", SHT_PROGBITS, SHF_ALLOC, int64Bytes({1234, 5678}), 8);
  // viaGot: mov rax, [rip + first@GOTPCREL]; mov rax, [rax]; ret
  // direct: mov rax, [rip + second]; ret
  const int text = elf.section(".text", SHT_PROGBITS, kCode,
                               bytes({0x48, 0x8b, 0x05, 0, 0, 0, 0, 0x48, 0x8b, 0x00, 0xc3, //
                                      0x48, 0x8b, 0x05, 0, 0, 0, 0, 0xc3}));
  const int first = elf.symbol("first", rodata, 0, STT_OBJECT);
  const int second = elf.symbol("second", rodata, 8, STT_OBJECT);
  elf.symbol("viaGot", text, 0, STT_FUNC);
  elf.symbol("direct", text, 11, STT_FUNC);
  elf.relocate(text, 3, first, R_X86_64_REX_GOTPCRELX, -4);
  elf.relocate(text, 14, second, R_X86_64_PC32, -4);
  const std::string object = elf.build();
  EXPECT_EQ(reinterpret_cast<Function>(loadObject(object, "viaGot", {}).address)(), 1234);
  EXPECT_EQ(reinterpret_cast<Function>(loadObject(object, "direct", {}).address)(), 5678);
}

TEST(ObjectLoader, LargeCodeModelSequencesFindTheirData) {
  // What LLVM emits for the JIT (large code model, PIC): the GOT's address from a 64-bit
  // GOT-relative offset, then data at 64-bit offsets from the GOT (GOTOFF64) or through a slot
  // (GOT64).
  //  0: lea rcx, [rip]           (rcx = 7)
  //  7: movabs rax, GOT - 7      (GOTPC64 at 9: GOT + A - P, P = 9, A = 2)
  // 17: add rcx, rax             (rcx = GOT)
  // 20: movabs rax, value - GOT  (GOTOFF64 at 22) or the value's GOT slot (GOT64 at 22)
  // 30: mov rax, [rcx + rax]     (the value, or its address)
  // 34: ret, or (GOT64) 34: mov rax, [rax]; 37: ret
  for (uint32_t type : {R_X86_64_GOTOFF64, R_X86_64_GOT64}) {
    ElfWriter elf;
    const int rodata =
        elf.section(".lrodata", SHT_PROGBITS, SHF_ALLOC, int64Bytes({-99, 31337}), 8);
    std::string code = bytes({0x48, 0x8d, 0x0d, 0, 0, 0, 0,                            //
                              0x48, 0xb8, 0,    0, 0, 0, 0, 0, 0, 0, 0x48, 0x01, 0xc1, //
                              0x48, 0xb8, 0,    0, 0, 0, 0, 0, 0, 0, 0x48, 0x8b, 0x04, 0x01});
    code += type == R_X86_64_GOT64 ? bytes({0x48, 0x8b, 0x00, 0xc3}) : bytes({0xc3});
    const int text = elf.section(".ltext", SHT_PROGBITS, kCode, code);
    const int got = elf.symbol("_GLOBAL_OFFSET_TABLE_", SHN_UNDEF, 0, STT_NOTYPE);
    const int value = elf.symbol("value", rodata, 8, STT_OBJECT);
    elf.symbol("entry", text, 0, STT_FUNC);
    elf.relocate(text, 9, got, R_X86_64_GOTPC64, 2);
    elf.relocate(text, 22, value, type, 0);
    EXPECT_EQ(reinterpret_cast<Function>(loadObject(elf.build(), "entry", {}).address)(), 31337)
        << "relocation type " << type;
  }
}

TEST(ObjectLoader, WritableDataKeepsItsValueBetweenCalls) {
  ElfWriter elf;
  const int data = elf.section(".data", SHT_PROGBITS, SHF_ALLOC | SHF_WRITE, int64Bytes({0}), 8);
  // mov rax, [rip + counter]; inc rax; mov [rip + counter], rax; ret
  const int text = elf.section(
      ".text", SHT_PROGBITS, kCode,
      bytes({0x48, 0x8b, 0x05, 0, 0, 0, 0, 0x48, 0xff, 0xc0, 0x48, 0x89, 0x05, 0, 0, 0, 0, 0xc3}));
  const int counter = elf.symbol("counter", data, 0, STT_OBJECT);
  elf.symbol("entry", text, 0, STT_FUNC);
  elf.relocate(text, 3, counter, R_X86_64_PC32, -4);
  elf.relocate(text, 13, counter, R_X86_64_PC32, -4);
  LoadedFunction f = loadObject(elf.build(), "entry", {});
  auto entry = reinterpret_cast<Function>(f.address);
  EXPECT_EQ(entry(), 1);
  EXPECT_EQ(entry(), 2);
}

void expectRefused(const std::string& object, const std::string& function, const std::string& why) {
  try {
    loadObject(object, function, {});
    ADD_FAILURE() << "loaded, expected an error containing: " << why;
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(ObjectLoader, RefusesWhatItCannotLoad) {
  expectRefused("hello", "entry", "truncated");
  expectRefused(std::string(sizeof(Elf64_Ehdr), '\0'), "entry", "not a 64-bit little-endian ELF");
  ElfWriter arm;
  arm.machine = EM_AARCH64;
  arm.symbol("entry", arm.section(".text", SHT_PROGBITS, kCode, bytes({0xc3})), 0, STT_FUNC);
  expectRefused(arm.build(), "entry", "not an x86-64 relocatable object");
  const std::string calling = objectCalling(R_X86_64_PLT32, "rnnc_no_such_function");
  expectRefused(calling, "entry", "nothing defines 'rnnc_no_such_function'");
  expectRefused(objectCalling(R_X86_64_PLT32, "strlen"), "other", "defines no function 'other'");
  expectRefused(objectCalling(R_X86_64_TPOFF64, "strlen"), "entry", "relocation type 18");
}

TEST(ObjectLoader, TruncatedOrDamagedObjectsAreErrorsNeverCrashes) {
  const std::string object = objectCalling(R_X86_64_PLT32, "rnnc_test_external");
  const ExternalSymbols symbols = {{"rnnc_test_external", reinterpret_cast<void*>(&fortyTwo)}};
  // Cut anywhere: the section headers are at the end, so every cut loses some of them.
  for (size_t size = 0; size < object.size(); ++size)
    EXPECT_THROW(loadObject(object.substr(0, size), "entry", symbols), InternalError) << size;
  // Any one byte damaged: loaded (not called: the code may be damaged) or refused, in bounds
  // (the sanitizer job runs this too).
  for (size_t at = 0; at < object.size(); ++at)
    for (unsigned char value : {0x00, 0x7f, 0xff}) {
      std::string damaged = object;
      damaged[at] = static_cast<char>(value);
      try {
        loadObject(damaged, "entry", symbols);
      } catch (const InternalError&) {
      }
    }
}

} // namespace loader_test
} // namespace rnnc
