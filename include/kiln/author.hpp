// kiln for kernel authors and tools: the registry and KernelSpec (kiln/registry.hpp), and how an
// operator call becomes the Signature the selector sees. Engine users include kiln/kiln.hpp.
#pragma once

#include <string>
#include <vector>

#include "kiln/ops.hpp"
#include "kiln/registry.hpp"
#include "kiln/signature.hpp"

namespace kiln {

// Validation and the selector's view of a call, exposed for tools and tests. validate_* throws
// kiln::Error(kInvalidArgument); signature_of builds the Signature the selector sees.
void validate(const MhaPrefillArgs& args);
void validate(const MhaDecodeArgs& args);
void validate(const MhaExtendArgs& args);
void validate(const KvAppendArgs& args);
void validate(const MoeArgs& args);
Signature signature_of(const MhaPrefillArgs& args);
Signature signature_of(const MhaDecodeArgs& args);
Signature signature_of(const MhaExtendArgs& args);
Signature signature_of(const KvAppendArgs& args);
Signature signature_of(const MoeArgs& args);

// The keys signature_of() produces for an operator: `required` always, `optional` in some calls
// (moe_apply: "logits" with router logits, "renormalize" with softmax-then-top-k routing).
struct SignatureKeys {
  std::vector<std::string> required;
  std::vector<std::string> optional;
};
SignatureKeys signature_keys(const OperatorId& op);
// Checks a signature written by hand (the CLI's --sig, kiln_explain_json, manifests) against its
// operator: kiln::Error(kInvalidArgument) for an unknown or missing key (naming the full set) or a
// value no call can give (a flag not 0/1, a number below 1, an unknown name). A valid signature
// that no kernel accepts is not an error here: selecting it fails with kNoKernel.
void validate_signature(const Signature& sig);

}  // namespace kiln
