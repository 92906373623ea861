#include "shardwise/plan/cluster.h"

#include <cmath>
#include <algorithm>
#include <fstream>
#include <set>

#include "shardwise/core/error.h"

namespace shardwise::plan {

using nlohmann::json;

namespace {

struct Reader {
  const std::string& where;

  // The object at `key` of `parent` (named `path` in errors), with only the keys `allowed`.
  const json& object(const json& parent, const std::string& key, const std::string& path,
                     std::initializer_list<const char*> allowed) const {
    SW_CHECK(parent.contains(key), "{}: key '{}' is missing", where, path);
    const json& j = parent.at(key);
    SW_CHECK(j.is_object(), "{}: key '{}' expects an object, got {}", where, path, j.dump());
    only(j, path, allowed);
    return j;
  }

  void only(const json& j, const std::string& path, std::initializer_list<const char*> allowed) const {
    std::set<std::string> names(allowed.begin(), allowed.end());
    for (auto it = j.begin(); it != j.end(); ++it)
      SW_CHECK(names.count(it.key()), "{}: unknown key '{}{}' (allowed there: {})", where,
               path.empty() ? "" : path + ".", it.key(), fmt::join(names, ", "));
  }

  // A positive finite number at `key` (named `path`).
  double positive(const json& parent, const std::string& key, const std::string& path) const {
    SW_CHECK(parent.contains(key), "{}: key '{}' is missing", where, path);
    const json& v = parent.at(key);
    SW_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0,
             "{}: key '{}' expects a positive number, got {}", where, path, v.dump());
    return v.get<double>();
  }

  int64_t count(const json& parent, const std::string& key) const {
    double v = positive(parent, key, key);
    SW_CHECK(v == std::floor(v) && v < 1e9, "{}: key '{}' expects a whole number of at least 1, got {}", where, key,
             parent.at(key).dump());
    return static_cast<int64_t>(v);
  }

  LinkSpec link(const json& links, const std::string& key) const {
    const std::string path = "links." + key;
    const json& j = object(links, key, path, {"bandwidth", "latency"});
    LinkSpec l;
    l.bandwidth = positive(j, "bandwidth", path + ".bandwidth");
    SW_CHECK(j.contains("latency"), "{}: key '{}.latency' is missing", where, path);
    const json& lat = j.at("latency");
    SW_CHECK(lat.is_number() && lat.get<double>() >= 0 && std::isfinite(lat.get<double>()),
             "{}: key '{}.latency' expects seconds (a number >= 0), got {}", where, path, lat.dump());
    l.latency = lat.get<double>();
    return l;
  }
};

// calibration.collectives (or calibration.mpi.collectives, `path`): {kind: {ranks, points: [[bytes,
// seconds], ...]}}; points sorted by bytes.
std::map<std::string, MeasuredCollective> parse_measured(const json& collectives, const Reader& r, const std::string& path) {
  std::map<std::string, MeasuredCollective> out;
  SW_CHECK(collectives.is_object(), "{}: key '{}' expects an object of kind -> measurement", r.where, path);
  for (auto it = collectives.begin(); it != collectives.end(); ++it) {
    const std::string key = path + "." + it.key();
    const json& m = it.value();
    SW_CHECK(m.is_object() && m.contains("points") && m["points"].is_array(), "{}: key '{}' expects {{ranks, points}}",
             r.where, key);
    MeasuredCollective mc;
    mc.ranks = static_cast<int>(r.count(m, "ranks"));
    for (const json& p : m["points"]) {
      SW_CHECK(p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number() && p[0].get<double>() > 0 &&
                   p[1].get<double>() > 0,
               "{}: key '{}.points' expects [bytes, seconds] pairs of positive numbers, got {}", r.where, key, p.dump());
      mc.points.emplace_back(p[0].get<double>(), p[1].get<double>());
    }
    std::sort(mc.points.begin(), mc.points.end());
    out[it.key()] = mc;
  }
  return out;
}

// calibration.kernels ({type: {overhead_s, scale}}), calibration.step_overhead_s, instruction_gap_s,
// cores, busy_kernel_scales, rank_factors and mesh_factors.
void parse_calibration_fits(const json& cal, const Reader& r, ClusterSpec& c) {
  if (cal.contains("kernels")) {
    SW_CHECK(cal["kernels"].is_object(), "{}: key 'calibration.kernels' expects an object of type -> fit", r.where);
    for (auto it = cal["kernels"].begin(); it != cal["kernels"].end(); ++it) {
      const std::string key = "calibration.kernels." + it.key();
      SW_CHECK(it.value().is_object() && it.value().contains("overhead_s") && it.value().contains("scale") &&
                   it.value()["overhead_s"].is_number() && it.value()["scale"].is_number() &&
                   it.value()["overhead_s"].get<double>() >= 0 && it.value()["scale"].get<double>() >= 0,
               "{}: key '{}' expects {{overhead_s, scale}}, two numbers >= 0", r.where, key);
      c.kernel_fits[it.key()] = {it.value()["overhead_s"].get<double>(), it.value()["scale"].get<double>()};
    }
  }
  for (auto [key, field] : {std::pair{"step_overhead_s", &c.step_overhead_s}, std::pair{"instruction_gap_s", &c.instruction_gap_s}}) {
    if (!cal.contains(key)) continue;
    SW_CHECK(cal[key].is_number() && cal[key].get<double>() >= 0, "{}: key 'calibration.{}' expects a number >= 0", r.where, key);
    *field = cal[key].get<double>();
  }
  if (cal.contains("cores")) c.cores = r.count(cal, "cores");
  if (cal.contains("busy_kernel_scales")) {
    const json& b = cal["busy_kernel_scales"];
    SW_CHECK(b.is_object(), "{}: key 'calibration.busy_kernel_scales' expects an object of type -> scale", r.where);
    for (auto it = b.begin(); it != b.end(); ++it)
      c.busy_kernel_scales[it.key()] = r.positive(b, it.key(), "calibration.busy_kernel_scales." + it.key());
  }
  if (cal.contains("rank_factors")) {
    SW_CHECK(cal["rank_factors"].is_object(), "{}: key 'calibration.rank_factors' expects an object of ranks -> factor", r.where);
    for (auto it = cal["rank_factors"].begin(); it != cal["rank_factors"].end(); ++it) {
      const double v = r.positive(cal["rank_factors"], it.key(), "calibration.rank_factors." + it.key());
      c.rank_factors[std::stoll(it.key())] = v;
    }
  }
  if (cal.contains("mpi")) {
    SW_CHECK(cal["mpi"].is_object() && cal["mpi"].contains("link") && cal["mpi"]["link"].is_object(),
             "{}: key 'calibration.mpi' expects an object with a link {{bandwidth, latency}}", r.where);
    const json& link = cal["mpi"]["link"];
    c.mpi_link.bandwidth = r.positive(link, "bandwidth", "calibration.mpi.link.bandwidth");
    SW_CHECK(link.contains("latency") && link["latency"].is_number() && link["latency"].get<double>() >= 0,
             "{}: key 'calibration.mpi.link.latency' expects seconds (a number >= 0)", r.where);
    c.mpi_link.latency = link["latency"].get<double>();
    if (cal["mpi"].contains("collectives"))
      c.mpi_collectives = parse_measured(cal["mpi"]["collectives"], r, "calibration.mpi.collectives");
  }
  if (cal.contains("collectives")) c.measured_collectives = parse_measured(cal["collectives"], r, "calibration.collectives");
  if (cal.contains("mesh_factors")) {
    SW_CHECK(cal["mesh_factors"].is_object(), "{}: key 'calibration.mesh_factors' expects an object of mesh -> factor", r.where);
    for (auto it = cal["mesh_factors"].begin(); it != cal["mesh_factors"].end(); ++it)
      c.mesh_factors[it.key()] = r.positive(cal["mesh_factors"], it.key(), "calibration.mesh_factors." + it.key());
  }
}

}  // namespace

double ClusterSpec::factor(const std::string& name) const {
  auto it = efficiency.find(name);
  return it == efficiency.end() ? 1.0 : it->second;
}

double ClusterSpec::peak(const std::string& dtype) const {
  auto it = peak_flops.find(dtype);
  SW_CHECK(it != peak_flops.end(), "cluster '{}' gives no peak FLOP/s for dtype '{}'", name, dtype);
  return it->second;
}

ClusterSpec parse_cluster(const json& j, const std::string& where) {
  Reader r{where};
  SW_CHECK(j.is_object(), "{}: a cluster description is a JSON object, got {}", where, j.type_name());
  r.only(j, "", {"name", "nodes", "devices_per_node", "device", "links", "efficiency", "sources", "calibration"});
  ClusterSpec c;
  SW_CHECK(j.contains("name") && j["name"].is_string(), "{}: key 'name' expects a string", where);
  c.name = j["name"].get<std::string>();
  c.nodes = r.count(j, "nodes");
  c.devices_per_node = r.count(j, "devices_per_node");
  const json& dev = r.object(j, "device", "device", {"peak_flops", "memory_bytes", "memory_bandwidth"});
  const json& peaks = r.object(dev, "peak_flops", "device.peak_flops", {"f32", "tf32", "bf16"});
  for (const char* d : kPeakDtypes) c.peak_flops[d] = r.positive(peaks, d, std::string("device.peak_flops.") + d);
  c.memory_bytes = r.positive(dev, "memory_bytes", "device.memory_bytes");
  c.memory_bandwidth = r.positive(dev, "memory_bandwidth", "device.memory_bandwidth");
  const json& links = r.object(j, "links", "links", {"intra_node", "inter_node"});
  c.intra_node = r.link(links, "intra_node");
  c.inter_node = r.link(links, "inter_node");
  if (j.contains("efficiency")) {
    const json& eff = r.object(j, "efficiency", "efficiency", {"compute", "memory", "network"});
    for (auto it = eff.begin(); it != eff.end(); ++it) {
      double v = r.positive(eff, it.key(), "efficiency." + it.key());
      SW_CHECK(v <= 1, "{}: key 'efficiency.{}' expects a factor in (0, 1], got {}", where, it.key(), v);
      c.efficiency[it.key()] = v;
    }
  }
  if (j.contains("calibration") && j["calibration"].is_object() && j["calibration"].contains("gemm")) {
    for (const json& g : j["calibration"]["gemm"]) {
      GemmRate rate;
      SW_CHECK(g.is_object() && g.contains("dtype") && g["dtype"].is_string(),
               "{}: key 'calibration.gemm' expects objects with dtype, m, n, k and flops_per_s", where);
      rate.dtype = g["dtype"].get<std::string>();
      rate.m = r.count(g, "m"), rate.n = r.count(g, "n"), rate.k = r.count(g, "k");
      rate.flops_per_s = r.positive(g, "flops_per_s", "calibration.gemm.flops_per_s");
      c.gemm_rates.push_back(rate);
    }
  }
  if (j.contains("calibration") && j["calibration"].is_object() && j["calibration"].contains("optimizer")) {
    c.optimizer_elements_per_s =
        r.positive(j["calibration"]["optimizer"], "elements_per_s", "calibration.optimizer.elements_per_s");
  }
  if (j.contains("calibration") && j["calibration"].is_object()) parse_calibration_fits(j["calibration"], r, c);
  if (j.contains("sources")) {
    SW_CHECK(j["sources"].is_object(), "{}: key 'sources' expects an object of key -> source text", where);
    c.sources = j["sources"];
  }
  return c;
}

ClusterSpec load_cluster(const std::string& path) {
  std::ifstream in(path);
  SW_CHECK(in.good(), "cannot read the cluster file {}", path);
  json j = json::parse(in, nullptr, false, true);  // comments allowed
  SW_CHECK(!j.is_discarded(), "{}: not valid JSON", path);
  return parse_cluster(j, path);
}

ClusterSpec for_backend(ClusterSpec c, bool mpi) {
  if (mpi && c.mpi_link.bandwidth > 0) c.intra_node = c.inter_node = c.mpi_link, c.measured_collectives = c.mpi_collectives;
  c.waits_hold_cores = mpi;
  return c;
}

json cluster_json(const ClusterSpec& c) {
  json j = {{"name", c.name}, {"nodes", c.nodes}, {"devices_per_node", c.devices_per_node}};
  j["device"] = {{"peak_flops", c.peak_flops}, {"memory_bytes", c.memory_bytes}, {"memory_bandwidth", c.memory_bandwidth}};
  j["links"] = {{"intra_node", {{"bandwidth", c.intra_node.bandwidth}, {"latency", c.intra_node.latency}}},
                {"inter_node", {{"bandwidth", c.inter_node.bandwidth}, {"latency", c.inter_node.latency}}}};
  if (!c.efficiency.empty()) j["efficiency"] = c.efficiency;
  j["sources"] = c.sources;
  return j;
}

}  // namespace shardwise::plan
