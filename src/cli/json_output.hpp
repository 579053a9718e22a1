// The command line's --json: each command prints one JSON object whose "schema" is the version of
// its shape (README, "The command line"); a list goes under a named key. Bump kJsonSchema when a
// shape loses or changes a field.
#pragma once

#include <iostream>
#include <utility>

#include <nlohmann/json.hpp>

namespace kiln::cli {

inline constexpr int kJsonSchema = 1;

inline void print_json(nlohmann::json j, const char* list_key = "items") {
  if (!j.is_object()) j = nlohmann::json{{list_key, std::move(j)}};
  j["schema"] = kJsonSchema;
  std::cout << j.dump(2) << "\n";
}

}  // namespace kiln::cli
