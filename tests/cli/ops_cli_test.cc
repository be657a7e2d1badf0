// `sluice ops` as a user runs it: the built binary lists every op of the registry with its
// signature and a doc, as text and as JSON, and refuses an unknown op by name.
#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"
#include "sluice/ir/op_registry.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

class OpsCli : public CliTest {
 protected:
  CliResult Ops(const std::string& args) { return Sluice("ops " + args); }
};

TEST_F(OpsCli, JsonListsEveryRegisteredOpWithADocAndItsSignature) {
  const CliResult r = Ops("--format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json listed = nlohmann::json::parse(r.out);
  ASSERT_TRUE(listed.is_array());

  std::set<std::string> names;
  for (const nlohmann::json& op : listed) {
    const std::string name = op.at("name");
    names.insert(name);
    EXPECT_FALSE(op.at("doc").get<std::string>().empty()) << name << " has no doc";
    const OpDef& def = OpRegistry::Global().Get(name);
    EXPECT_EQ(op.at("inputs").size(), def.signature.inputs.size()) << name;
    EXPECT_EQ(op.at("attrs").size(), def.signature.attrs.size()) << name;
    EXPECT_EQ(op.at("outputs").size(), def.signature.outputs.size()) << name;
    for (const char* part : {"inputs", "attrs", "outputs"}) {
      for (const nlohmann::json& p : op.at(part)) {
        EXPECT_FALSE(p.at("name").get<std::string>().empty()) << name << " " << part;
        EXPECT_FALSE(p.at("type").get<std::string>().empty()) << name << " " << part;
      }
    }
  }
  for (const OpDef* def : OpRegistry::Global().All()) {
    EXPECT_EQ(names.count(def->name), 1u) << def->name << " is registered but not listed";
  }
  EXPECT_EQ(names.size(), OpRegistry::Global().All().size());
}

TEST_F(OpsCli, TextShowsSignatureDocAndTraits) {
  const CliResult r = Ops("");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const OpDef* def : OpRegistry::Global().All()) {
    EXPECT_THAT(r.out, HasSubstr(def->name + "(")) << def->name;
    EXPECT_THAT(r.out, HasSubstr("  " + def->doc + "\n")) << def->name;
  }
  EXPECT_THAT(r.out,
              HasSubstr("layer_norm(x: float or bf16[..., C], weight: float[C], bias: float[C]) "
                        "{eps: float = 1e-05} -> y: x's dtype[..., C]\n"));
  EXPECT_THAT(r.out, HasSubstr("compute; reference and fast kernels; VJP; recomputable"));
  EXPECT_THAT(r.out, HasSubstr("in place: updates its inputs, no outputs; reference and fast "
                               "kernels; no VJP"));
}

TEST_F(OpsCli, NamedOpsOnlyInTheOrderGiven) {
  const CliResult r = Ops("linear matmul --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json listed = nlohmann::json::parse(r.out);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].at("name"), "linear");
  EXPECT_EQ(listed[1].at("name"), "matmul");
  EXPECT_EQ(listed[1].at("kind"), "compute");
  EXPECT_EQ(listed[1].at("differentiable"), true);
}

TEST_F(OpsCli, AnUnknownOpIsAnErrorThatSaysWhereToLook) {
  const CliResult r = Ops("matmul frobnicate");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("unknown op 'frobnicate'"));
  EXPECT_THAT(r.err, HasSubstr("`sluice ops` lists"));
  EXPECT_EQ(r.out, "");
}

}  // namespace
}  // namespace sluice
