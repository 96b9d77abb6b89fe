// Reading the weights out of PyTorch's torch.save files (the zip format of PyTorch 1.6 and
// later): `torch.save(model.state_dict(), "m.pt")`, or a checkpoint that nests one
// (`{"model": model.state_dict(), "optimizer": ..., "epoch": 3}`). No PyTorch and no Python: the
// archive's pickle is read by a restricted unpickler that runs nothing (runtime/data/Unpickler.h)
// and each tensor's data taken from its storage entry.
//
// Every floating-point tensor reachable through dicts, lists and tuples is read, named by the
// keys on its way joined with '.' (a state_dict's own names; the checkpoint above gives
// model.weight_ih_l0, ...: select them with a prefix, --weights-prefix model.). float32 as it
// is; float64, float16 and bfloat16 converted to float32; any layout (strides, offsets into a
// shared storage). Integer and bool tensors and everything else (numbers, strings, optimiser
// settings, other objects) are skipped. Refused with a message that says what to do instead:
// a whole pickled model (`torch.save(model)`), a TorchScript archive, the legacy format of
// PyTorch before 1.6, and every malformed archive or pickle (naming the file).
#pragma once

#include "runtime/data/Tensor.h"
#include "runtime/data/ZipArchive.h"

#include <map>
#include <string>
#include <string_view>

namespace rnnc {

using TensorMap = std::map<std::string, Tensor>;

// The archive's tensors (a file: readWeightFile, runtime/data/WeightFile.h); `path` names it in
// messages.
TensorMap readTorchCheckpoint(const ByteSource& archive, const std::string& path);
// The same over bytes in memory.
TensorMap parseTorchCheckpoint(std::string_view bytes, const std::string& path);

// Whether the bytes start as torch.save's files do (a zip, or the legacy format's pickle of its
// magic number); the first 4 bytes tell.
bool looksLikeTorchCheckpoint(std::string_view bytes);

} // namespace rnnc
