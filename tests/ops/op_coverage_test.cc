// Every op the registry knows has at least one case in the op tables (tests/ops/<family>_test.cc),
// so no op escapes the harness: registering an op without a case fails here, naming it.
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "op_harness.h"

namespace sluice::testing {
namespace {

std::set<std::string> OpsWithACase() {
  std::set<std::string> ops;
  for (const auto& table : {AttentionCases(), BatchNormCases(), ConvCases(), DropoutCases(),
                            ElementwiseCases(), LinalgCases(), NnCases(), OptimizerCases(),
                            ReductionCases(), SelectCases(), ShapeCases()}) {
    for (const OpCase& c : table) ops.insert(c.op);
  }
  return ops;
}

TEST(OpCoverage, EveryRegisteredOpHasAHarnessCase) {
  const std::set<std::string> covered = OpsWithACase();
  std::vector<std::string> missing;
  for (const OpDef* op : OpRegistry::Global().All()) {
    if (covered.count(op->name) == 0) missing.push_back(op->name);
  }
  std::string list;
  for (const std::string& name : missing) list += (list.empty() ? "" : ", ") + name;
  EXPECT_TRUE(missing.empty()) << missing.size() << " registered op(s) without a case in "
                               << "tests/ops/: " << list;
}

TEST(OpCoverage, EveryCaseNamesARegisteredOp) {
  for (const std::string& op : OpsWithACase()) {
    EXPECT_NE(OpRegistry::Global().Find(op), nullptr) << "a case names the unknown op " << op;
  }
}

}  // namespace
}  // namespace sluice::testing
