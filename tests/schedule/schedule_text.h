// Test helper: writes a schedule by hand in the compact action names of schedule.h, one string per
// rank — "F0 SEND_F0>1 RECV_B0<1 B0 OPT", "F1.0" for chunk 1 of micro-batch 0 — so that tests
// can state wrong schedules as plainly as the validator reports them.
#pragma once

#include <ostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/schedule/schedule.h"

namespace sluice::pipeline {

// gtest prints actions by their compact names.
inline void PrintTo(const Action& a, std::ostream* os) { *os << ActionName(a, 2); }

namespace testing {

inline Action ParseAction(const std::string& token) {
  static const std::regex kAction(
      R"((SEND_F|RECV_F|SEND_B|RECV_B|F|B|W)(?:(\d+)\.)?(\d+)(?:[<>](\d+))?)");
  if (token == "OPT") return {.kind = ActionKind::kOptimizer};
  std::smatch m;
  if (!std::regex_match(token, m, kAction)) {
    ADD_FAILURE() << "not an action: " << token;
    return {};
  }
  static const std::vector<std::string> kKinds = {"F",      "B",      "W",     "SEND_F",
                                                  "RECV_F", "SEND_B", "RECV_B"};
  Action a;
  for (size_t k = 0; k < kKinds.size(); ++k) {
    if (kKinds[k] == m[1].str()) a.kind = static_cast<ActionKind>(k);
  }
  a.chunk = m[2].matched ? std::stoi(m[2].str()) : 0;
  a.micro_batch = std::stoi(m[3].str());
  a.peer = m[4].matched ? std::stoi(m[4].str()) : -1;
  return a;
}

struct ScheduleText {
  std::string name = "hand";
  int micro_batches = 1;
  int chunks = 1;
  bool split_backward = false;
  std::vector<std::string> ranks;  // one line of actions per rank
};

inline Schedule FromText(const ScheduleText& text) {
  Schedule s{.name = text.name,
             .stages = static_cast<int>(text.ranks.size()),
             .micro_batches = text.micro_batches,
             .chunks = text.chunks,
             .split_backward = text.split_backward};
  for (const std::string& line : text.ranks) {
    std::istringstream in(line);
    s.ranks.emplace_back();
    for (std::string token; in >> token;) s.ranks.back().push_back(ParseAction(token));
  }
  return s;
}

}  // namespace testing
}  // namespace sluice::pipeline
