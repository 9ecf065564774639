// xpipe-train: trains a pipeline on Fashion-MNIST with the schedule, predictor, optimizer and
// shape chosen by flags, or (--compare) runs the study of every schedule x predictor.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "models.hpp"
#include "xpipe/xpipe.hpp"

namespace fs = std::filesystem;
using namespace xpipe;

namespace {

struct RunConfig {
  std::string model = "mlp";
  int stages = 4;
  int micro_batches = 4;
  std::string schedule = "async-1f1b";
  std::string predictor = "xpipe";
  std::string optimizer = "adam";
  float lr = 1e-3f;
  long batch = 128;
  int epochs = 3;
  std::uint64_t seed = 1;
  std::string executor = "threaded";
  std::string label() const { return schedule + "+" + predictor + "(" + optimizer + ")"; }
};

struct EpochRecord {
  int epoch = 0;
  double loss = 0, test_accuracy = 0, samples_per_second = 0, seconds = 0;
  std::vector<double> bubble;  // measured per stage
};

struct RunRecord {
  RunConfig config;
  std::vector<EpochRecord> epochs;
  std::vector<int> weight_copies;
  std::vector<double> activation_mib;  // peak per stage
  ExecutionTrace trace;                // of the last epoch
};

bool interactive() { return isatty(fileno(stdout)) != 0; }

// Runs one configuration on one compiled Pipeline type.
template <class P>
RunRecord run_pipeline(const RunConfig& c, const DatasetPair& data) {
  P pipe(make_optimizer(c.optimizer, c.lr),
         PipelineOptions{.batch = c.batch, .micro_batches = c.micro_batches, .seed = c.seed});
  Batcher batcher(data.train, c.batch, c.seed);
  HostBuffer<float> x(data.train.count * data.train.width);
  HostBuffer<std::int32_t> y(data.train.count);
  const Matrix xm{x.data(), data.train.count, data.train.width};
  const index_t n = pipe.mini_batches_for(data.train.count);
  const Schedule schedule = make_schedule(c.schedule, P::stage_count, c.micro_batches, static_cast<int>(n));
  RunRecord rec;
  rec.config = c;
  ReferenceExecutor reference;
  ThreadedExecutor threaded;
  for (int e = 1; e <= c.epochs; ++e) {
    batcher.gather_epoch(static_cast<std::uint64_t>(e), xm, y.data());
    const EpochData epoch{xm, y.data()};
    const EpochResult r = c.executor == "reference" ? pipe.train(schedule, epoch, reference)
                                                    : pipe.train(schedule, epoch, threaded);
    const ExecutionTrace& tr = c.executor == "reference" ? reference.trace() : threaded.trace();
    EpochRecord er;
    er.epoch = e;
    er.loss = r.loss;
    er.seconds = r.seconds;
    er.samples_per_second = static_cast<double>(r.samples) / r.seconds;
    er.test_accuracy = pipe.evaluate(data.test);
    for (int k = 0; k < P::stage_count; ++k) er.bubble.push_back(tr.bubble_fraction(k));
    std::printf("  %-34s epoch %d  loss %.4f  test %.2f%%  %8.0f samples/s\n", c.label().c_str(), e,
                er.loss, 100 * er.test_accuracy, er.samples_per_second);
    std::fflush(stdout);
    rec.epochs.push_back(er);
    if (e == c.epochs) rec.trace = tr;
  }
  for (int k = 0; k < P::stage_count; ++k) {
    rec.weight_copies.push_back(pipe.weight_copies(k));
    rec.activation_mib.push_back(static_cast<double>(pipe.activation_floats(k)) * 4 / (1 << 20));
  }
  return rec;
}

template <class... Stages>
RunRecord run_stages(const RunConfig& c, const DatasetPair& data) {
  const std::string& p = c.predictor;
  if (p == "latest") return run_pipeline<Pipeline<Stages..., Latest, AnyOptimizer>>(c, data);
  if (p == "stash") return run_pipeline<Pipeline<Stages..., Stash, AnyOptimizer>>(c, data);
  if (p == "2bw") return run_pipeline<Pipeline<Stages..., DoubleBuffered, AnyOptimizer>>(c, data);
  if (p == "spectrain") return run_pipeline<Pipeline<Stages..., SpecTrain, AnyOptimizer>>(c, data);
  if (p == "xpipe") return run_pipeline<Pipeline<Stages..., XPipe, AnyOptimizer>>(c, data);
  if (p == "pipeoptim") return run_pipeline<Pipeline<Stages..., PipeOptim, AnyOptimizer>>(c, data);
  throw ConfigError("unknown predictor '" + p +
                    "' (available: latest, stash, 2bw, spectrain, xpipe, pipeoptim)");
}

using Runner = std::function<RunRecord(const RunConfig&, const DatasetPair&)>;
const std::map<std::pair<std::string, int>, Runner>& model_table() {
  using namespace tools;
  static const std::map<std::pair<std::string, int>, Runner> table{
      {{"mlp", 1}, run_stages<mlp::K1>},
      {{"mlp", 2}, run_stages<mlp::K2a, mlp::K2b>},
      {{"mlp", 4}, run_stages<mlp::A, mlp::B, mlp::C, mlp::D>},
      {{"deep", 8}, run_stages<deep::In, deep::Mid, deep::Mid, deep::Mid, deep::Mid, deep::Mid,
                               deep::Mid, deep::Out>},
  };
  return table;
}

std::string available_models() {
  std::string s;
  for (const auto& [key, fn] : model_table())
    s += (s.empty() ? "" : ", ") + key.first + " with --stages " + std::to_string(key.second);
  return s;
}

RunRecord run(const RunConfig& c, const DatasetPair& data) {
  const auto it = model_table().find({c.model, c.stages});
  if (it == model_table().end())
    throw ConfigError("no compiled model '" + c.model + "' over " + std::to_string(c.stages) +
                      " stages (available: " + available_models() + ")");
  return it->second(c, data);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"xpipe-train: pipeline-parallel training on Fashion-MNIST"};
  RunConfig c;
  std::string data_dir = default_fashion_mnist_dir();
  std::string out_dir = "xpipe-out";
  bool compare = false;
  app.add_option("--model", c.model, "Model: mlp (784-1024-1024-1024-10) or deep (784-512x7-10)")
      ->check(CLI::IsMember({"mlp", "deep"}));
  app.add_option("--stages,-K", c.stages, "Pipeline stages K (mlp: 1, 2, 4; deep: 8)")
      ->check(CLI::Range(1, 64));
  app.add_option("--micro-batches,-M", c.micro_batches, "Micro-batches per mini-batch M")
      ->check(CLI::Range(1, 1024));
  app.add_option("--schedule", c.schedule, "gpipe, 1f1b-flush, async-1f1b or 2bw")
      ->check(CLI::IsMember({"gpipe", "1f1b-flush", "async-1f1b", "2bw"}));
  app.add_option("--predictor", c.predictor, "latest, stash, 2bw, spectrain, xpipe or pipeoptim")
      ->check(CLI::IsMember({"latest", "stash", "2bw", "spectrain", "xpipe", "pipeoptim"}));
  app.add_option("--optimizer", c.optimizer, "sgd (momentum 0.9), adam or adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("--lr", c.lr, "Learning rate")->check(CLI::PositiveNumber);
  app.add_option("--batch", c.batch, "Mini-batch size")->check(CLI::Range(1L, 60000L));
  app.add_option("--epochs", c.epochs, "Epochs")->check(CLI::Range(1, 1000));
  app.add_option("--seed", c.seed, "Seed of initialisation and shuffling");
  app.add_option("--executor", c.executor, "threaded (a thread per stage) or reference")
      ->check(CLI::IsMember({"threaded", "reference"}));
  app.add_option("--data-dir", data_dir, "Directory of the four Fashion-MNIST .gz files");
  app.add_option("--out", out_dir, "Output directory (CSV, JSON)");
  app.add_flag("--compare", compare, "Run the study: every schedule x predictor on this model");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return e.get_exit_code() == 0 ? code : 2;
  }
  try {
    if (c.micro_batches > c.batch) throw ConfigError("--micro-batches exceeds --batch");
    const DatasetPair data = load_fashion_mnist(data_dir);
    std::vector<RunConfig> runs;
    if (compare) {
      auto with = [&](const char* sched, const char* pred, const char* opt, float lr) {
        RunConfig r = c;
        r.schedule = sched;
        r.predictor = pred;
        r.optimizer = opt;
        r.lr = lr;
        return r;
      };
      const float sgd_lr = 0.05f;
      runs = {with("gpipe", "latest", "adam", c.lr),        with("1f1b-flush", "latest", "adam", c.lr),
              with("async-1f1b", "latest", "adam", c.lr),   with("async-1f1b", "stash", "adam", c.lr),
              with("2bw", "2bw", "adam", c.lr),             with("async-1f1b", "spectrain", "sgd", sgd_lr),
              with("async-1f1b", "xpipe", "adam", c.lr),    with("async-1f1b", "pipeoptim", "adam", c.lr)};
    } else {
      runs = {c};
    }
    std::printf("xpipe-train: model %s over %d stages, M = %d, batch %ld, %d epochs, seed %lu\n",
                c.model.c_str(), c.stages, c.micro_batches, c.batch, c.epochs,
                static_cast<unsigned long>(c.seed));
    std::vector<RunRecord> records;
    for (const RunConfig& r : runs) records.push_back(run(r, data));

    std::printf("\n%-34s %9s %9s %10s %12s %14s %18s\n", "run", "test_acc", "loss", "samples/s",
                "bubble_max", "weight_copies", "peak_act_MiB_max");
    for (const RunRecord& r : records) {
      const EpochRecord& last = r.epochs.back();
      double bub = 0, act = 0;
      for (double b : last.bubble) bub = std::max(bub, b);
      for (double a : r.activation_mib) act = std::max(act, a);
      std::string copies;
      for (int w : r.weight_copies) copies += (copies.empty() ? "" : "/") + std::to_string(w);
      std::printf("%-34s %8.2f%% %9.4f %10.0f %12.3f %14s %18.2f\n", r.config.label().c_str(),
                  100 * last.test_accuracy, last.loss, last.samples_per_second, bub,
                  copies.c_str(), act);
    }
    fs::create_directories(out_dir);
    nlohmann::json j = nlohmann::json::array();
    std::ofstream csv(fs::path(out_dir) / "runs.csv");
    csv << "run,schedule,predictor,optimizer,lr,stages,micro_batches,epoch,loss,test_accuracy,"
           "samples_per_second\n";
    for (const RunRecord& r : records) {
      nlohmann::json jr{{"run", r.config.label()},           {"schedule", r.config.schedule},
                        {"predictor", r.config.predictor},   {"optimizer", r.config.optimizer},
                        {"lr", r.config.lr},                 {"stages", r.config.stages},
                        {"micro_batches", r.config.micro_batches}, {"model", r.config.model},
                        {"weight_copies", r.weight_copies},  {"peak_activation_mib", r.activation_mib}};
      for (const EpochRecord& e : r.epochs) {
        jr["epochs"].push_back({{"epoch", e.epoch}, {"loss", e.loss}, {"test_accuracy", e.test_accuracy},
                                {"samples_per_second", e.samples_per_second}, {"seconds", e.seconds},
                                {"bubble_fraction", e.bubble}});
        csv << r.config.label() << ',' << r.config.schedule << ',' << r.config.predictor << ','
            << r.config.optimizer << ',' << r.config.lr << ',' << r.config.stages << ','
            << r.config.micro_batches << ',' << e.epoch << ',' << e.loss << ',' << e.test_accuracy
            << ',' << e.samples_per_second << '\n';
      }
      j.push_back(jr);
    }
    std::ofstream(fs::path(out_dir) / "runs.json") << j.dump(2) << '\n';
    std::printf("\nwrote %s/runs.csv and %s/runs.json\n", out_dir.c_str(), out_dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xpipe-train: %s\n", e.what());
    return 1;
  }
}
