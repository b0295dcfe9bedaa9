// Node labels for Kubernetes' node-feature-discovery (NFD): what `query` found, as the feature
// file that NFD's `local` source reads from /etc/kubernetes/node-feature-discovery/features.d/
// (`cupool query --format nfd`; docs/kubernetes.md).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "device/node.h"

namespace cupool {

// Every label's prefix. A sub-namespace of feature.node.kubernetes.io: nfd-master publishes those
// in every release without configuration and can't be told to deny them; another vendor
// namespace needs -extra-label-ns before NFD v0.13 and can be denied after it.
inline constexpr std::string_view kNfdLabelPrefix = "cupool.feature.node.kubernetes.io/";

// One node label: the full name (prefix included) and a valid Kubernetes label value.
struct NodeLabel {
  std::string name;
  std::string value;
};

// The labels that describe `report` (the devices it holds, so `--devices` narrows them), in a
// fixed order: driver, GPU count and product, pool support, pool handle types, fabric, peer access.
// A handle type is "true" only when every device's pools support it, since a pod may get any GPU.
std::vector<NodeLabel> nfd_labels(const NodeReport& report);

// `report`'s labels as an NFD feature file: comment lines naming the source, then `name=value`.
std::string render_nfd(const NodeReport& report);

// `text` as a label value (at most 63 characters of [A-Za-z0-9._-], starting and ending with a
// letter or digit): each run of other characters becomes one '-'; "unknown" if nothing is left.
std::string nfd_label_value(std::string_view text);

}  // namespace cupool
