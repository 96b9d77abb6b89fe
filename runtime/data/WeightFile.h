// A weight file in either format rnnc reads, told apart by its first bytes: safetensors, or
// PyTorch's torch.save archive (a state_dict, or a checkpoint nesting one:
// runtime/data/TorchCheckpoint.h). The errors are those of the format's reader, naming the file.
#pragma once

#include "runtime/data/SafeTensors.h"

#include <string>

namespace rnnc {

// `reading` applies to safetensors files (a torch.save archive's tensors are always copied:
// converted from their stored type and layout).
TensorMap readWeightFile(const std::string& path, TensorReading reading = TensorReading::copied);

} // namespace rnnc
