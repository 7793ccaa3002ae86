// The HTML report: the data as JSON in a template (src/report/report.html) whose script draws it
// with Chart.js; template and Chart.js are compiled in (cmake/embed.cmake).
#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <ctime>
#include <unordered_map>

#include "lopper/analysis.h"
#include "lopper/error.h"
#include "lopper/files.h"
#include "lopper/report.h"
#include "lopper/sensitivity.h"
#include "lopper/train.h"

namespace lopper {

namespace report_assets {
extern const unsigned char kChartJs[];
extern const std::size_t kChartJs_size;
extern const unsigned char kTemplate[];
extern const std::size_t kTemplate_size;
}  // namespace report_assets

namespace {

std::string asset(const unsigned char* bytes, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(bytes), size);
}

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

// JSON inside a <script> element: "</" would end the element early; "<\/" is the same JSON string.
std::string script_safe(std::string json) {
  for (size_t at = json.find("</"); at != std::string::npos; at = json.find("</", at + 3))
    json.replace(at, 2, "<\\/");
  return json;
}

// Replaces the one `marker` of `page` by `text`.
void fill(std::string& page, const std::string& marker, const std::string& text) {
  const size_t at = page.find(marker);
  LOPPER_ASSERT(at != std::string::npos, "report template lacks ", marker);
  page.replace(at, marker.size(), text);
}

}  // namespace

HtmlReport::HtmlReport(std::string kind, std::string title, std::string command) {
  data_ = {{"format", "lopper.report/1"},
           {"kind", std::move(kind)},
           {"title", std::move(title)},
           {"command", std::move(command)},
           {"created", utc_now()},
           {"version", LOPPER_VERSION},
           {"models", nlohmann::json::array()},
           {"layers", nlohmann::json::array()},
           {"notes", nlohmann::json::array()}};
}

void HtmlReport::add_model(const ReportModel& m, const ModelCost& cost) {
  nlohmann::json jm = {
      {"label", m.label},          {"path", m.path}, {"params", m.params},
      {"nonzero", m.nonzero},      {"macs", m.macs}, {"effective_macs", m.effective_macs},
      {"file_bytes", m.file_bytes}};
  if (m.latency_ms >= 0) jm["latency_ms"] = m.latency_ms;
  if (m.latency_p90_ms >= 0) {
    jm["latency_p10_ms"] = m.latency_p10_ms;
    jm["latency_p90_ms"] = m.latency_p90_ms;
    jm["latency_runs"] = m.latency_runs;
  }
  if (!m.latency_warning.empty()) {
    jm["latency_warning"] = m.latency_warning;
    add_note(m.label + ": " + m.latency_warning);
  }
  if (m.top1 >= 0) jm["top1"] = m.top1;
  if (m.loss >= 0) jm["loss"] = m.loss;
  if (!m.measured.empty()) jm["measured"] = m.measured;
  nlohmann::json& models = data_["models"];
  const size_t column = models.size();
  models.push_back(jm);

  // Per layer: one value per model; earlier models' rows get this model's, new layers are added
  // with zeros for the models before.
  nlohmann::json& layers = data_["layers"];
  std::unordered_map<std::string, size_t> row;
  for (size_t i = 0; i < layers.size(); ++i) row[layers[i]["name"].get<std::string>()] = i;
  for (const auto& l : cost.layers) {
    auto it = row.find(l.name);
    if (it == row.end()) {
      nlohmann::json zeros = std::vector<int64_t>(column, 0);
      layers.push_back({{"name", l.name},
                        {"param", l.param},
                        {"op", l.op},
                        {"params", zeros},
                        {"nonzero", zeros},
                        {"macs", zeros}});
      it = row.emplace(l.name, layers.size() - 1).first;
    }
    nlohmann::json& jl = layers[it->second];
    jl["params"].push_back(l.params);
    jl["nonzero"].push_back(l.nonzero);
    jl["macs"].push_back(l.macs);
  }
  for (auto& jl : layers)  // layers this model lacks (removed)
    for (const char* f : {"params", "nonzero", "macs"})
      if (jl[f].size() <= column) jl[f].push_back(0);
}

void HtmlReport::add_sensitivity(const SensitivityResult& r, bool tradeoff) {
  nlohmann::json js = {{"unit", r.unit},       {"method", r.method},
                       {"top1", r.top1},       {"loss", r.loss},
                       {"samples", r.samples}, {"params", r.params},
                       {"macs", r.macs},       {"layers", nlohmann::json::array()}};
  for (const auto& l : r.layers) {
    nlohmann::json jl = {{"name", l.name},
                         {"param", l.param},
                         {"params", l.params},
                         {"macs", l.macs},
                         {"points", nlohmann::json::array()}};
    for (const auto& p : l.points)
      jl["points"].push_back({{"amount", p.amount},
                              {"removed", p.removed},
                              {"loss", p.loss},
                              {"top1", p.top1},
                              {"params", p.params},
                              {"macs", p.macs}});
    js["layers"].push_back(jl);
  }
  data_["sensitivity"] = js;
  if (!tradeoff || r.params <= 0) return;
  const std::string intro = fmt::format(
      "Every point of the sensitivity sweep: the share of the model's {} nonzero parameters it "
      "removed and the top-1 it kept, one colour per {}. Points high and to the right are cheap "
      "savings.",
      r.params, r.unit == "channel" ? "channel group" : "layer");
  if (data_["tradeoff"].is_null())  // else a report's own "before" is the unpruned point
    add_tradeoff("share of the nonzero parameters removed", "top-1", intro,
                 {"unpruned", {{0.0, r.top1, ""}}, false, "reference"});
  for (const auto& l : r.layers) {
    ReportSeries s{l.label(), {}, true, ""};
    s.points.push_back({0.0, r.top1, "unpruned"});
    for (const auto& p : l.points)
      s.points.push_back(
          {1.0 - double(p.params) / double(r.params), p.top1, fmt::format("at {:g}", p.amount)});
    add_tradeoff("", "", "", s);
  }
}

void HtmlReport::add_target(const nlohmann::json& target,
                            const std::vector<std::pair<std::string, double>>& chosen) {
  data_["target"] = target;
  nlohmann::json jc = nlohmann::json::array();
  for (const auto& [name, amount] : chosen) jc.push_back({{"name", name}, {"amount", amount}});
  data_["chosen"] = jc;
}

void HtmlReport::add_training(const TrainResult& r, const std::vector<ReportStep>& steps,
                              const std::string& eval_split, double eval_top1) {
  // The epochs as the JSON report has them, without the fp16 steps skipped.
  nlohmann::json jt = {{"epochs", to_json(r)["epochs"]}, {"steps", nlohmann::json::array()}};
  for (auto& e : jt["epochs"]) e.erase("skipped_steps");
  for (const auto& s : steps)
    jt["steps"].push_back(
        {{"epoch", s.epoch}, {"loss", s.loss}, {"accuracy", s.accuracy}, {"lr", s.lr}});
  if (eval_top1 >= 0) jt["eval"] = {{"split", eval_split}, {"top1", eval_top1}};
  data_["training"] = jt;
  for (const auto& n : r.notes) add_note(n);
}

void HtmlReport::add_tradeoff(const std::string& x, const std::string& y, const std::string& intro,
                              const ReportSeries& series) {
  nlohmann::json& t = data_["tradeoff"];
  if (t.is_null()) t = {{"x", x}, {"y", y}, {"intro", intro}, {"series", nlohmann::json::array()}};
  nlohmann::json js = {{"label", series.label},
                       {"line", series.line},
                       {"role", series.role},
                       {"points", nlohmann::json::array()}};
  for (const auto& p : series.points) {
    nlohmann::json jp = {{"x", p.x}, {"y", p.y}};
    if (!p.label.empty()) jp["label"] = p.label;
    js["points"].push_back(jp);
  }
  t["series"].push_back(js);
}

void HtmlReport::add_note(const std::string& note) { data_["notes"].push_back(note); }

std::string HtmlReport::html() const {
  std::string page = asset(report_assets::kTemplate, report_assets::kTemplate_size);
  // The data first, so that a marker inside Chart.js is never taken for the data's; the Chart.js
  // marker comes before the data in the template, so the data cannot shadow it either.
  fill(page, "{{data}}",
       script_safe(data_.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  fill(page, "{{chart.js}}", asset(report_assets::kChartJs, report_assets::kChartJs_size));
  return page;
}

void HtmlReport::write(const std::string& path) const { write_file_atomic(path, html()); }

}  // namespace lopper
