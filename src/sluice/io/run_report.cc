#include "sluice/io/run_report.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/core/files.h"
#include "sluice/core/json_text.h"

namespace sluice {

using Json = nlohmann::json;

// The page around the data: report_page.cc.
std::string_view ReportPageTemplate();

namespace {

// The kind of a pipeline trace span by its name: "F3" → F, "SEND_B1" → SEND, "OPT" → OPT.
std::string SpanKind(const std::string& name) {
  for (const char* kind : {"SEND", "RECV", "ALLREDUCE", "OPT"}) {
    if (name.starts_with(kind)) return kind;
  }
  if (!name.empty() && (name[0] == 'F' || name[0] == 'B' || name[0] == 'W') &&
      (name.size() == 1 || std::isdigit(static_cast<unsigned char>(name[1])))) {
    return name.substr(0, 1);
  }
  return "other";
}

bool IsCompute(const std::string& kind) {
  return kind == "F" || kind == "B" || kind == "W" || kind == "OPT";
}

std::string ValueText(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return fmt::format("{:.6g}", v.get<double>());
  return v.dump();
}

// Rows [key, value] for every scalar of `object`, nested keys joined with '.'.
void ConfigRows(const Json& object, const std::string& prefix, Json& rows) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object()) {
      ConfigRows(*it, key, rows);
    } else if (!it->is_array()) {
      rows.push_back(Json::array({key, ValueText(*it)}));
    }
  }
}

// "" when `object` has no `key` or an integer there; else what is wrong, for a message.
std::string NotInteger(const Json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_number_integer()) return "";
  return fmt::format("\"{}\" is {}, not an integer", key, it->dump());
}

// The same for a count or an index ("step", "stage"): an integer from 0 to 2^63 - 1 (a step of
// 2^63 was drawn as negative, and negative ones were drawn as they came).
std::string NotCount(const Json& object, const char* key) {
  if (std::string bad = NotInteger(object, key); !bad.empty()) return bad;
  const auto it = object.find(key);
  if (it == object.end()) return "";
  const bool fits = it->is_number_unsigned()
                        ? it->get<uint64_t>() <= uint64_t{std::numeric_limits<int64_t>::max()}
                        : it->get<int64_t>() >= 0;
  if (fits) return "";
  return fmt::format("\"{}\" is {}, outside 0 to 9223372036854775807", key, it->dump());
}

// The same for a number; null passes too (the metrics write a non-finite loss as null).
std::string NotNumber(const Json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_number() || it->is_null()) return "";
  return fmt::format("\"{}\" is {}, not a number", key, it->dump());
}

// The figures the report draws from a metrics line or a summary's stage: read as 0 when absent,
// so a value of another type would be drawn as 0 without a word; each within its range (a
// negative byte count, a bubble above 1 were drawn as they came).
constexpr double kNoBound = std::numeric_limits<double>::infinity();
constexpr struct {
  const char* key;
  double least, most;
} kFigures[] = {{"loss", -kNoBound, kNoBound},
                {"lr", 0, kNoBound},
                {"tokens_per_s", 0, kNoBound},
                {"examples_per_s", 0, kNoBound},
                {"val_loss", -kNoBound, kNoBound},
                {"accuracy", 0, 1},
                {"peak_allocated_bytes", 0, kNoBound},
                {"peak_reserved_bytes", 0, kNoBound},
                {"liveness_bound_bytes", 0, kNoBound},
                {"predicted_peak_allocated_bytes", 0, kNoBound},
                {"bubble", 0, 1}};

// The first of kFigures in `object` that is not a number, or out of its range; "" when none.
std::string BadFigure(const Json& object) {
  for (const auto& f : kFigures) {
    if (std::string bad = NotNumber(object, f.key); !bad.empty()) return bad;
    const auto it = object.find(f.key);
    if (it == object.end() || it->is_null()) continue;
    const double v = it->get<double>();
    if (v < f.least || v > f.most) {
      return f.most == kNoBound ? fmt::format("\"{}\" is {}, below {}", f.key, it->dump(), f.least)
                                : fmt::format("\"{}\" is {}, outside {} to {}", f.key, it->dump(),
                                              f.least, f.most);
    }
  }
  return "";
}

// The same for a string.
std::string NotText(const Json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_string()) return "";
  return fmt::format("\"{}\" is {}, not a string", key, it->dump());
}

// What TraceData reads from an event with a type of its own, checked where the file is known:
// "" when the event is fine (or not an object: TraceData skips those).
std::string BadTraceEvent(const Json& e) {
  if (!e.is_object()) return "";
  for (const char* key : {"ph", "name"}) {
    if (std::string bad = NotText(e, key); !bad.empty()) return bad;
  }
  for (const char* key : {"pid", "tid"}) {
    if (std::string bad = NotInteger(e, key); !bad.empty()) return bad;
  }
  for (const char* key : {"ts", "dur"}) {
    if (std::string bad = NotNumber(e, key); !bad.empty()) return bad;
  }
  const auto args = e.find("args");
  if (args != e.end()) {
    if (!args->is_object()) return fmt::format("\"args\" is {}, not an object", args->dump());
    if (std::string bad = NotText(*args, "name"); !bad.empty()) return "in \"args\", " + bad;
  }
  return "";
}

double Number(const Json& line, const char* key, double fallback = 0) {
  auto it = line.find(key);
  return it != line.end() && it->is_number() ? it->get<double>() : fallback;
}

Json TraceData(const std::vector<Json>& traces) {
  struct Stage {
    std::string name;
    Json spans = Json::array();
    Json memory = Json::array();
    double compute_us = 0;
  };
  std::map<int64_t, Stage> stages;  // by process id
  double begin = std::numeric_limits<double>::infinity(), end = -begin;
  for (const Json& events : traces) {
    for (const Json& e : events) {
      if (!e.is_object() || !e.contains("ph") || !e.contains("pid")) continue;
      const std::string ph = e.value("ph", "");
      const int64_t pid = e["pid"].get<int64_t>();
      if (ph == "M" && e.value("name", "") == "process_name") {
        // find, not operator[]: on a const object a missing key is undefined behaviour.
        const auto args = e.find("args");
        if (args != e.end() && args->is_object()) stages[pid].name = args->value("name", "");
      } else if (ph == "X") {
        const std::string name = e.value("name", "");
        const std::string kind = SpanKind(name);
        const double b = Number(e, "ts"), d = Number(e, "dur");
        const int64_t lane = e.value("tid", int64_t{0});
        stages[pid].spans.push_back(
            {{"name", name}, {"kind", kind}, {"lane", lane}, {"begin_us", b}, {"dur_us", d}});
        if (IsCompute(kind)) stages[pid].compute_us += d;
        begin = std::min(begin, b);
        end = std::max(end, b + d);
      } else if (ph == "C" && e.value("name", "") == "allocated bytes" && e.contains("args")) {
        for (const auto& [series, value] : e["args"].items()) {
          if (value.is_number()) stages[pid].memory.push_back({Number(e, "ts"), value});
        }
      }
    }
  }
  Json out = Json::array();
  for (auto& [pid, s] : stages) {
    if (s.spans.empty() && s.memory.empty()) continue;
    const double span = end - begin;
    out.push_back({{"pid", pid},
                   {"name", s.name.empty() ? fmt::format("process {}", pid) : s.name},
                   {"spans", std::move(s.spans)},
                   {"memory", std::move(s.memory)},
                   {"bubble", span > 0 ? 1.0 - s.compute_us / span : 0.0}});
  }
  if (out.empty()) return nullptr;
  return {{"begin_us", begin}, {"end_us", end}, {"stages", std::move(out)}};
}

}  // namespace

std::vector<Json> ReadMetricsFile(const std::string& path) {
  return ParseMetricsText(ReadWholeFile("metrics file", path), path);
}

std::vector<Json> ParseMetricsText(const std::string& text, const std::string& path) {
  std::istringstream in(text);
  std::vector<Json> lines;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Json j;
    try {
      j = ParseJsonText(line);
    } catch (const Json::parse_error& e) {
      throw ParseError(path, number, static_cast<int>(e.byte),
                       fmt::format("not a JSON line of sluice train --metrics: {}", e.what()));
    } catch (const Json::out_of_range& e) {  // a number past a double: 1e999 (406)
      throw ParseError(path, number, 1,
                       fmt::format("not a JSON line of sluice train --metrics: {}", e.what()));
    }
    if (!j.is_object()) {
      throw ParseError(path, number, 1,
                       "a metrics line must be a JSON object (sluice train --metrics)");
    }
    // What the report reads as an integer, checked here where the line is known.
    std::string bad = NotCount(j, "step");
    if (bad.empty()) bad = BadFigure(j);
    const auto stages = j.find("stages");
    if (bad.empty() && j.contains("summary") && stages != j.end() && stages->is_array()) {
      for (const Json& stage : *stages) {
        if (!stage.is_object()) {
          bad = fmt::format("\"stages\" holds {}, not an object", stage.dump());
        } else if (std::string b = NotCount(stage, "stage"); !b.empty()) {
          bad = "in \"stages\", " + b;
        } else if (std::string f = BadFigure(stage); !f.empty()) {
          bad = "in \"stages\", " + f;
        }
        if (!bad.empty()) break;
      }
    }
    if (!bad.empty()) {
      throw ParseError(path, number, 1,
                       fmt::format("{} (not a line of sluice train --metrics)", bad));
    }
    lines.push_back(std::move(j));
  }
  return lines;
}

Json ReadTraceFile(const std::string& path) {
  return ParseTraceText(ReadWholeFile("trace file", path), path);
}

Json ParseTraceText(std::string_view text, const std::string& path) {
  Json j;
  try {
    j = ParseJsonText(text);
  } catch (const Json::parse_error& e) {
    throw ParseError(path, 1, static_cast<int>(e.byte),
                     fmt::format("not a Chrome trace (JSON): {}", e.what()));
  } catch (const Json::out_of_range& e) {  // a number past a double: 1e999 (406)
    throw ParseError(path, 1, 1, fmt::format("not a Chrome trace (JSON): {}", e.what()));
  }
  if (j.is_object() && j.contains("traceEvents")) j = j["traceEvents"];
  if (!j.is_array()) {
    throw ParseError(path, 1, 1,
                     "not a Chrome trace: expected {\"traceEvents\": [...]} or an event array");
  }
  for (size_t i = 0; i < j.size(); ++i) {
    if (const std::string bad = BadTraceEvent(j[i]); !bad.empty()) {
      throw InvalidArgument(
          fmt::format("trace file '{}': event {} is not a Chrome trace event: {}", path, i, bad));
    }
  }
  return j;
}

namespace {

// ReportData's metrics part (the trace's already condensed).
Json MetricsData(const std::vector<Json>& metrics, Json trace, const std::string& what) {
  std::map<int64_t, const Json*> steps;  // a step logged again (after a resume) replaces the first
  std::map<int64_t, const Json*> evals;
  const Json* summary = nullptr;
  for (const Json& line : metrics) {
    if (line.contains("summary")) {
      summary = &line;
    } else if (line.contains("step") && line.contains("loss")) {
      steps[line["step"].get<int64_t>()] = &line;
    } else if (line.contains("step") && line.contains("val_loss")) {
      evals[line["step"].get<int64_t>()] = &line;
    }
  }
  if (steps.empty()) {
    throw InvalidArgument(fmt::format(
        "{} hold no step (no line with \"step\" and \"loss\"): is this the --metrics file of "
        "sluice train?",
        what));
  }
  // Throughput in tokens (a language model) or examples (a classifier on arrays), as the run's
  // metrics name it (Trainer: "<unit>_per_s").
  const std::string unit =
      steps.begin()->second->contains("examples_per_s") ? "examples" : "tokens";
  const std::string per_s = unit + "_per_s";
  Json s = {{"step", Json::array()},
            {"loss", Json::array()},
            {"lr", Json::array()},
            {"per_s", Json::array()},
            {"peak_allocated_bytes", Json::array()}};
  for (const auto& [step, line] : steps) {
    s["step"].push_back(step);
    s["loss"].push_back(Number(*line, "loss"));
    s["lr"].push_back(Number(*line, "lr"));
    s["per_s"].push_back(Number(*line, per_s.c_str()));
    s["peak_allocated_bytes"].push_back(Number(*line, "peak_allocated_bytes"));
  }
  Json e = {{"step", Json::array()}, {"val_loss", Json::array()}, {"accuracy", Json::array()}};
  for (const auto& [step, line] : evals) {
    e["step"].push_back(step);
    e["val_loss"].push_back(Number(*line, "val_loss"));
    e["accuracy"].push_back(line->contains("accuracy") ? (*line)["accuracy"] : Json(nullptr));
  }

  Json stages = Json::array();
  Json config = Json::array();
  if (summary != nullptr && summary->contains("stages") && (*summary)["stages"].is_array()) {
    for (const Json& st : (*summary)["stages"]) {
      Json entry = {{"stage", st.value("stage", int64_t{0})},
                    {"peak_allocated_bytes", Number(st, "peak_allocated_bytes")},
                    {"peak_reserved_bytes", Number(st, "peak_reserved_bytes")},
                    {"bubble", Number(st, "bubble")}};
      if (st.contains("replica")) entry["replica"] = st["replica"];
      // Optional figures: the liveness bound and `sluice plan`'s prediction, when the run has them.
      for (const char* key : {"liveness_bound_bytes", "predicted_peak_allocated_bytes"}) {
        if (st.contains(key) && st[key].is_number()) entry[key] = st[key];
      }
      stages.push_back(std::move(entry));
    }
  } else {
    // One stage: the run's peaks (from the summary, or the largest step's).
    double peak = 0, reserved = 0;
    for (const auto& [step, line] : steps) {
      peak = std::max(peak, Number(*line, "peak_allocated_bytes"));
      reserved = std::max(reserved, Number(*line, "peak_reserved_bytes"));
    }
    Json entry = {
        {"stage", 0},
        {"peak_allocated_bytes", summary ? Number(*summary, "peak_allocated_bytes", peak) : peak},
        {"peak_reserved_bytes",
         summary ? Number(*summary, "peak_reserved_bytes", reserved) : reserved}};
    for (const char* key : {"liveness_bound_bytes", "predicted_peak_allocated_bytes"}) {
      if (summary && summary->contains(key) && (*summary)[key].is_number())
        entry[key] = (*summary)[key];
    }
    stages.push_back(std::move(entry));
  }
  if (summary != nullptr) {
    Json flat = *summary;
    flat.erase("summary");
    flat.erase("stages");
    ConfigRows(flat, "", config);
  }
  Json data = {{"steps", std::move(s)},          {"evals", std::move(e)},
               {"stages", std::move(stages)},    {"config", std::move(config)},
               {"complete", summary != nullptr}, {"trace", std::move(trace)}};
  data["unit"] = unit;
  if (summary != nullptr && summary->contains(per_s))
    data["per_s"] = Number(*summary, per_s.c_str());
  return data;
}

}  // namespace

Json ReportData(const std::vector<Json>& metrics, const std::vector<Json>& traces,
                const std::string& metrics_path) {
  const std::string what =
      metrics_path.empty() ? "the metrics" : fmt::format("the metrics '{}'", metrics_path);
  // A value of the wrong type (a string step, an event without a numeric pid) is the file's fault:
  // say which file, not "internal error".
  Json trace;
  try {
    trace = TraceData(traces);
  } catch (const Json::exception& e) {
    throw InvalidArgument(
        fmt::format("the trace holds an event that is not a Chrome trace event: {}", e.what()));
  }
  try {
    return MetricsData(metrics, std::move(trace), what);
  } catch (const Json::exception& e) {
    throw InvalidArgument(fmt::format(
        "{} hold a line that sluice train --metrics does not write: {}", what, e.what()));
  }
}

std::string RenderReportHtml(const Json& data, const std::string& title) {
  // The data goes inside <script type="application/json">: "</" would end the element early.
  std::string json = data.dump(-1, ' ', /*ensure_ascii=*/true);
  for (size_t at = 0; (at = json.find("</", at)) != std::string::npos; at += 3) {
    json.replace(at, 2, "<\\/");
  }
  std::string escaped_title;
  for (char c : title) {
    switch (c) {
      case '<':
        escaped_title += "&lt;";
        break;
      case '>':
        escaped_title += "&gt;";
        break;
      case '&':
        escaped_title += "&amp;";
        break;
      case '"':
        escaped_title += "&quot;";
        break;
      case '@':
        escaped_title += "&#64;";
        break;  // the page's markers are @NAME@
      default:
        escaped_title += c;
    }
  }
  std::string page(ReportPageTemplate());
  auto replace = [&](std::string_view marker, const std::string& with) {
    const size_t at = page.find(marker);
    if (at == std::string::npos) throw InternalError(fmt::format("report page lacks {}", marker));
    page.replace(at, marker.size(), with);
  };
  replace("@TITLE@", escaped_title);
  replace("@TITLE@", escaped_title);
  replace("@DATA@", json);
  return page;
}

}  // namespace sluice
