#include "sluice/core/error.h"

namespace sluice::internal {

void CheckFailed(const char* file, int line, const char* condition, const std::string& message) {
  std::string text = fmt::format("{}:{}: check failed: {}", file, line, condition);
  if (!message.empty()) text += ": " + message;
  throw InternalError(text);
}

}  // namespace sluice::internal
