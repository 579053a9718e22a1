// Golden tests of the key's canonical bytes: a failure here means the key format changed. If the
// change is deliberate, bump kKeyFormatVersion (jit/key.hpp) and update the goldens.
#include <gtest/gtest.h>

#include <xxhash.h>

#include "jit/key.hpp"

namespace kiln::detail {
namespace {

CompileRequest golden_request() {
  CompileRequest r;
  r.kernel_name = "k";
  r.source_name = "k.cu";
  r.source = "#include \"b.h\"\n";
  r.headers = {{"b.h", "B"}, {"a.h", "A"}};  // deliberately unsorted
  r.name_expression = "f<1>";
  r.options = {"-std=c++17"};
  r.target = "sm_90a";
  return r;
}

std::string le64(uint64_t n) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  return s;
}
std::string field(const std::string& f) { return le64(f.size()) + f; }

TEST(KeyGolden, CanonicalBytes) {
  const std::string expected = field("kiln-kernel-key") + field("1") + field("k") + field("k.cu") + field("#include \"b.h\"\n") +
                               field("2") + field("a.h") + field("A") + field("b.h") + field("B") + field("f<1>") + field("1") +
                               field("-std=c++17") + field("sm_90a") + field("nvrtc 13.0 0123456789abcdef");
  EXPECT_EQ(key_material(golden_request(), "nvrtc 13.0 0123456789abcdef"), expected);
  EXPECT_EQ(kKeyFormatVersion, 1u);
}

TEST(KeyGolden, Hash) { EXPECT_EQ(compute_key(golden_request(), "nvrtc 13.0 0123456789abcdef").hex(), "b1c17345d185258b9e70549689db6e0b"); }

}  // namespace
}  // namespace kiln::detail
