// Axis positions in MESH_AXES order, for indexing a MeshShape or a Score in
// the mesh tests.
#pragma once

#include "dew/mesh.h"

namespace dew::mesh {

inline constexpr int kData = static_cast<int>(Axis::kData);
inline constexpr int kFsdp = static_cast<int>(Axis::kFsdp);
inline constexpr int kTensor = static_cast<int>(Axis::kTensor);
inline constexpr int kSequence = static_cast<int>(Axis::kSequence);

}  // namespace dew::mesh
