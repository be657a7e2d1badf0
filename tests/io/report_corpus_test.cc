// The report fuzzer's seed corpus (fuzz/corpus/report, fuzz/report_fuzz.cc) as a regression suite
// for what `sluice report` reads: each file is a metrics text, then after a NUL byte (when there
// is one) a trace. valid_* make a page; the others fail with ParseError or InvalidArgument.
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sluice/core/error.h"
#include "sluice/io/run_report.h"
#include "source_dir.h"

namespace sluice {
namespace {

TEST(ReportCorpus, EveryInputMakesAPageOrFailsCleanly) {
  int count = 0;
  for (const std::filesystem::path& file : testing_support::FuzzCorpus("report")) {
    ++count;
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t nul = bytes.find('\0');
    auto page = [&] {
      std::vector<nlohmann::json> traces;
      if (nul != std::string::npos) {
        traces.push_back(ParseTraceText(std::string_view(bytes).substr(nul + 1), file.string()));
      }
      return RenderReportHtml(
          ReportData(ParseMetricsText(bytes.substr(0, nul), file.string()), traces), "run");
    };
    if (file.filename().string().starts_with("valid_")) {
      std::string html;
      ASSERT_NO_THROW(html = page()) << file;
      EXPECT_NE(html.find("<html"), std::string::npos) << file;
    } else {
      try {
        page();
        ADD_FAILURE() << file << " made a page";
      } catch (const ParseError&) {
      } catch (const InvalidArgument&) {
      }
    }
  }
  EXPECT_GT(count, 0);
}

}  // namespace
}  // namespace sluice
