// xpipe-train: trains a pipeline on Fashion-MNIST with the schedule, predictor, optimizer and
// shape chosen by flags, or (--compare) runs the study of every schedule x predictor.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
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
  std::vector<double> activation_kib;  // peak per stage
  std::string failure;                 // why the run stopped early (divergence), if it did
  ExecutionTrace trace;                // of the last epoch
  Schedule schedule;                   // that the trace ran
};

bool interactive() {
  return isatty(fileno(stdout)) != 0;
}

// One line redrawn in place: [#####.....] 45%  loss 0.5312  12034 samples/s  ETA 3 s.
void show_progress(const std::string& label, int epoch, int epochs, long done, long total,
                   double loss, double seconds) {
  constexpr int width = 30;
  const double f = total > 0 ? std::min(1.0, static_cast<double>(done) / total) : 0.0;
  const int filled = static_cast<int>(f * width);
  const double rate = seconds > 0 ? done / seconds : 0.0;
  const double eta = rate > 0 ? (total - done) / rate : 0.0;
  std::printf("\r\033[K  %-30s epoch %d/%d [%s%s] %3.0f%%  loss %.4f  %6.0f samples/s  ETA %.0f s",
              label.c_str(), epoch, epochs, std::string(filled, '#').c_str(),
              std::string(width - filled, '.').c_str(), 100 * f, loss, rate, eta);
  std::fflush(stdout);
}

// A file-name form of a run label: async-1f1b+xpipe(adam) -> async-1f1b_xpipe_adam.
std::string file_stem(const std::string& label) {
  std::string out;
  for (char ch : label)
    if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-')
      out += ch;
    else if (!out.empty() && out.back() != '_')
      out += '_';
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

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
  const Schedule schedule =
      make_schedule(c.schedule, P::stage_count, c.micro_batches, static_cast<int>(n));
  RunRecord rec;
  rec.config = c;
  ReferenceExecutor reference;
  ThreadedExecutor threaded;
  for (int e = 1; e <= c.epochs; ++e) {
    batcher.gather_epoch(static_cast<std::uint64_t>(e), xm, y.data());
    const EpochData epoch{xm, y.data()};
    EpochResult r;
    std::exception_ptr failure;
    std::atomic<bool> finished{false};
    std::thread worker([&] {
      try {
        r = c.executor == "reference" ? pipe.train(schedule, epoch, reference)
                                      : pipe.train(schedule, epoch, threaded);
      } catch (...) {
        failure = std::current_exception();
      }
      finished = true;
    });
    const auto t0 = std::chrono::steady_clock::now();
    while (!finished) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (interactive()) {
        const auto p = pipe.progress();
        show_progress(c.label(), e, c.epochs, p.samples, data.train.count,
                      p.samples > 0 ? p.loss_sum / p.samples : 0.0,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    worker.join();
    if (interactive()) std::printf("\r\033[K");
    if (failure) std::rethrow_exception(failure);
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
    if (e == c.epochs) {
      rec.trace = tr;
      rec.schedule = schedule;
    }
  }
  for (int k = 0; k < P::stage_count; ++k) {
    rec.weight_copies.push_back(pipe.weight_copies(k));
    rec.activation_kib.push_back(static_cast<double>(pipe.activation_floats(k)) * 4 / 1024);
  }
  return rec;
}

template <class... Stages>
RunRecord run_stages(const RunConfig& c, const DatasetPair& data) {
  return with_predictor(c.predictor, [&]<class P>(std::type_identity<P>) {
    return run_pipeline<Pipeline<Stages..., P, AnyOptimizer>>(c, data);
  });
}

using Runner = std::function<RunRecord(const RunConfig&, const DatasetPair&)>;
const std::map<std::pair<std::string, int>, Runner>& model_table() {
  using namespace tools;
  static const std::map<std::pair<std::string, int>, Runner> table{
      {{"mlp", 1}, run_stages<mlp::K1>},
      {{"mlp", 2}, run_stages<mlp::K2a, mlp::K2b>},
      {{"mlp", 4}, run_stages<mlp::A, mlp::B, mlp::C, mlp::D>},
      {{"deep", 8},
       run_stages<deep::In, deep::Mid, deep::Mid, deep::Mid, deep::Mid, deep::Mid, deep::Mid,
                  deep::Out>},
  };
  return table;
}

std::string available_models() {
  std::string s;
  for (const auto& [key, fn] : model_table())
    s += (s.empty() ? "" : ", ") + key.first + " with --stages " + std::to_string(key.second);
  return s;
}

std::string joined(const std::vector<double>& v, const char* fmt) {
  std::string out;
  char buf[32];
  for (double x : v) {
    std::snprintf(buf, sizeof buf, fmt, x);
    out += (out.empty() ? "" : "/") + std::string(buf);
  }
  return out;
}

// The study's table: accuracy per epoch, final loss, throughput, and per stage the measured
// bubble (idle) fraction, weight copies held and peak activation memory.
void print_table(const std::vector<RunRecord>& records) {
  std::printf("\n%-30s %-22s %8s %9s  %-26s %-12s %s\n", "run", "test accuracy by epoch", "loss",
              "samples/s", "bubble per stage", "weights", "peak activations KiB");
  for (const RunRecord& r : records) {
    if (!r.failure.empty()) {
      std::printf("%-30s stopped: %s\n", r.config.label().c_str(), r.failure.c_str());
      continue;
    }
    std::vector<double> acc, copies;
    for (const EpochRecord& e : r.epochs) acc.push_back(100 * e.test_accuracy);
    for (int w : r.weight_copies) copies.push_back(w);
    const EpochRecord& last = r.epochs.back();
    std::printf("%-30s %-22s %8.4f %9.0f  %-26s %-12s %s\n", r.config.label().c_str(),
                joined(acc, "%.2f").c_str(), last.loss, last.samples_per_second,
                joined(last.bubble, "%.2f").c_str(), joined(copies, "%.0f").c_str(),
                joined(r.activation_kib, "%.0f").c_str());
  }
}

// runs.csv (long: a row per run and epoch), runs.json, accuracy.csv (wide: a column per run)
// with accuracy.gp beside it (gnuplot draws accuracy.svg and accuracy.png when installed), and
// per run a timeline SVG and a Chrome trace of its last epoch.
void write_outputs(const std::vector<RunRecord>& records, const std::string& dir) {
  fs::create_directories(dir);
  const fs::path out(dir);
  nlohmann::json j = nlohmann::json::array();
  std::ofstream csv(out / "runs.csv");
  csv << "run,schedule,predictor,optimizer,lr,model,stages,micro_batches,epoch,loss,"
         "test_accuracy,samples_per_second\n";
  for (const RunRecord& r : records) {
    const RunConfig& c = r.config;
    nlohmann::json jr{{"run", c.label()},
                      {"schedule", c.schedule},
                      {"predictor", c.predictor},
                      {"optimizer", c.optimizer},
                      {"lr", c.lr},
                      {"model", c.model},
                      {"stages", c.stages},
                      {"micro_batches", c.micro_batches},
                      {"batch", c.batch},
                      {"seed", c.seed},
                      {"executor", c.executor},
                      {"weight_copies", r.weight_copies},
                      {"peak_activation_kib", r.activation_kib},
                      {"timeline_svg", "timeline-" + file_stem(c.label()) + ".svg"},
                      {"chrome_trace", "trace-" + file_stem(c.label()) + ".json"}};
    if (!r.failure.empty()) {
      jr["failure"] = r.failure;
      jr.erase("timeline_svg");
      jr.erase("chrome_trace");
      j.push_back(jr);
      continue;
    }
    for (const EpochRecord& e : r.epochs) {
      jr["epochs"].push_back({{"epoch", e.epoch},
                              {"loss", e.loss},
                              {"test_accuracy", e.test_accuracy},
                              {"samples_per_second", e.samples_per_second},
                              {"seconds", e.seconds},
                              {"bubble_fraction", e.bubble}});
      csv << c.label() << ',' << c.schedule << ',' << c.predictor << ',' << c.optimizer << ','
          << c.lr << ',' << c.model << ',' << c.stages << ',' << c.micro_batches << ',' << e.epoch
          << ',' << e.loss << ',' << e.test_accuracy << ',' << e.samples_per_second << '\n';
    }
    j.push_back(jr);
    TimelineOptions to;
    to.title = c.label() + ": first mini-batches of the last epoch (threaded run, real times)";
    std::ofstream(out / ("timeline-" + file_stem(c.label()) + ".svg"))
        << timeline_svg(r.trace, r.schedule, to);
    std::ofstream(out / ("trace-" + file_stem(c.label()) + ".json"))
        << chrome_trace_json(r.trace, r.schedule, c.label());
  }
  std::ofstream(out / "runs.json") << j.dump(2) << '\n';

  std::vector<const RunRecord*> plotted;  // diverged runs have no accuracy curve
  for (const RunRecord& r : records)
    if (r.failure.empty()) plotted.push_back(&r);
  std::ofstream acc(out / "accuracy.csv");
  acc << "epoch";
  for (const RunRecord* r : plotted) acc << ',' << r->config.label();
  acc << '\n';
  std::size_t epochs = 0;
  for (const RunRecord* r : plotted) epochs = std::max(epochs, r->epochs.size());
  for (std::size_t e = 0; e < epochs; ++e) {
    acc << e + 1;
    for (const RunRecord* r : plotted) {
      acc << ',';
      if (e < r->epochs.size()) acc << 100 * r->epochs[e].test_accuracy;
    }
    acc << '\n';
  }
  acc.close();
  std::ofstream gp(out / "accuracy.gp");
  gp << "# Test accuracy per epoch of every run in accuracy.csv. Restyle freely; run from this\n"
        "# directory with: gnuplot accuracy.gp\n"
        "set datafile separator ','\n"
        "set key outside right top noenhanced\n"
        "set xlabel 'epoch'\nset ylabel 'test accuracy (%)'\nset grid\nset xtics 1\n"
        "set title 'Fashion-MNIST test accuracy by schedule and predictor' noenhanced\n"
        "n = "
     << plotted.size()
     << "\n"
        "set terminal svg size 1000,560 dynamic background rgb 'white'\n"
        "set output 'accuracy.svg'\n"
        "plot for [c=2:n+1] 'accuracy.csv' using 1:c with linespoints lw 2 title columnheader(c)\n"
        "set terminal pngcairo size 1000,560\nset output 'accuracy.png'\nreplot\n";
  gp.close();
  const std::string cmd = "cd '" + fs::absolute(out).string() + "' && gnuplot accuracy.gp 2>&1";
  if (std::system("command -v gnuplot > /dev/null 2>&1") == 0) {
    if (std::system(cmd.c_str()) != 0)
      std::fprintf(stderr, "xpipe-train: gnuplot failed; accuracy.gp is left in %s\n", dir.c_str());
  } else {
    std::fprintf(stderr,
                 "xpipe-train: gnuplot not found (Debian: gnuplot-nox); run 'gnuplot "
                 "accuracy.gp' in %s to draw the plots\n",
                 dir.c_str());
  }
  std::printf(
      "\nwrote to %s: runs.csv, runs.json, accuracy.csv, accuracy.gp, accuracy.svg, "
      "accuracy.png, and per run timeline-*.svg and trace-*.json (open in "
      "https://ui.perfetto.dev)\n",
      dir.c_str());
}

RunRecord run(const RunConfig& c, const DatasetPair& data) {
  const auto it = model_table().find({c.model, c.stages});
  if (it == model_table().end())
    throw ConfigError("no compiled model '" + c.model + "' over " + std::to_string(c.stages) +
                      " stages (available: " + available_models() + ")");
  return it->second(c, data);
}

// --lr and --sgd-lr: a finite number in [1e-8, 10]. Below 1e-8 a step is under half a float32
// ulp of any weight above 0.17 (ulp(1) = 1.2e-7), so nothing would train; above 10 nothing here
// trains either (Adam at lr 1 already leaves the MLP at chance with a loss of 1e9).
std::string check_learning_rate(std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') return "'" + text + "' is not a number";
  if (!std::isfinite(v) || v < 1e-8 || v > 10)
    return text + " is outside [1e-8, 10], the learning rates that can train";
  return "";
}

// --seed: a whole number from 0 to 2^64 - 1 ("-1" is not quietly taken as 2^64 - 1).
std::string check_seed(std::string& text) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    return "'" + text + "' is not a whole number from 0 to " +
           std::to_string(std::numeric_limits<std::uint64_t>::max());
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"xpipe-train: pipeline-parallel training on Fashion-MNIST"};
  RunConfig c;
  std::string data_dir = default_fashion_mnist_dir();
  std::string out_dir = "xpipe-out";
  bool compare = false;
  long train_samples = 0, test_samples = 0;
  float sgd_lr_flag = 0.05f;
  const CLI::Validator learning_rate(check_learning_rate, "in [1e-8, 10]");
  app.add_option("--model", c.model, "Model: mlp (784-1024-1024-1024-10) or deep (784-512x7-10)")
      ->check(CLI::IsMember({"mlp", "deep"}));
  app.add_option("--stages,-K", c.stages, "Pipeline stages K (mlp: 1, 2, 4; deep: 8)")
      ->check(CLI::Range(1, 64));
  app.add_option("--micro-batches,-M", c.micro_batches, "Micro-batches per mini-batch M")
      ->check(CLI::Range(1, 1024));
  // The name lists come from the library, so a new schedule or predictor needs no edit here.
  const auto names = [](const auto& list) {
    return std::vector<std::string>(list.begin(), list.end());
  };
  app.add_option("--schedule", c.schedule, "Schedule: " + join_names(schedule_names))
      ->check(CLI::IsMember(names(schedule_names)));
  app.add_option("--predictor", c.predictor, "Weight predictor: " + join_names(predictor_names))
      ->check(CLI::IsMember(names(predictor_names)));
  app.add_option("--optimizer", c.optimizer,
                 "Optimizer (sgd has momentum 0.9): " + join_names(optimizer_names))
      ->check(CLI::IsMember(names(optimizer_names)));
  app.add_option("--lr", c.lr, "Learning rate")->check(learning_rate);
  app.add_option("--batch", c.batch, "Mini-batch size")->check(CLI::Range(1L, 60000L));
  app.add_option("--epochs", c.epochs, "Epochs")->check(CLI::Range(1, 1000));
  app.add_option("--seed", c.seed, "Seed of initialisation and shuffling")
      ->check(CLI::Validator(check_seed, "0 to 2^64-1"));
  app.add_option("--executor", c.executor, "threaded (a thread per stage) or reference")
      ->check(CLI::IsMember({"threaded", "reference"}));
  app.add_option("--data-dir", data_dir, "Directory of the four Fashion-MNIST .gz files");
  app.add_option("--out", out_dir, "Output directory (CSV, JSON)");
  app.add_option("--train-samples", train_samples, "Train on the first N samples only (0: all)")
      ->check(CLI::Range(0L, 60000L));
  app.add_option("--test-samples", test_samples, "Evaluate on the first N test samples (0: all)")
      ->check(CLI::Range(0L, 10000L));
  app.add_option("--sgd-lr", sgd_lr_flag, "Learning rate of the SGD runs of --compare (SpecTrain)")
      ->check(learning_rate);
  app.add_flag("--compare", compare, "Run the study: every schedule x predictor on this model");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return e.get_exit_code() == 0 ? code : 2;
  }
  // Flag combinations that cannot run are usage errors too (exit 2), found before any work.
  if (!model_table().contains({c.model, c.stages})) {
    std::fprintf(stderr, "xpipe-train: no compiled model '%s' over %d stages (available: %s)\n",
                 c.model.c_str(), c.stages, available_models().c_str());
    return 2;
  }
  if (c.micro_batches > c.batch) {
    std::fprintf(stderr, "xpipe-train: --micro-batches (%d) exceeds --batch (%ld)\n",
                 c.micro_batches, c.batch);
    return 2;
  }
  try {
    DatasetPair data = load_fashion_mnist(data_dir);
    if (train_samples > 0) data.train = head(data.train, train_samples);
    if (test_samples > 0) data.test = head(data.test, test_samples);
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
      const float sgd_lr = sgd_lr_flag;
      runs = {with("gpipe", "latest", "adam", c.lr),
              with("1f1b-flush", "latest", "adam", c.lr),
              with("async-1f1b", "latest", "adam", c.lr),
              with("async-1f1b", "stash", "adam", c.lr),
              with("2bw", "2bw", "adam", c.lr),
              with("async-1f1b", "spectrain", "sgd", sgd_lr),
              with("async-1f1b", "xpipe", "adam", c.lr),
              with("async-1f1b", "pipeoptim", "adam", c.lr)};
    } else {
      runs = {c};
    }
    std::printf("xpipe-train: model %s over %d stages, M = %d, batch %ld, %d epochs, seed %lu\n",
                c.model.c_str(), c.stages, c.micro_batches, c.batch, c.epochs,
                static_cast<unsigned long>(c.seed));
    std::vector<RunRecord> records;
    for (const RunConfig& r : runs) {
      try {
        records.push_back(run(r, data));
      } catch (const Error& e) {
        // In a study one diverging configuration is a result, not a reason to stop.
        if (!compare) throw;
        std::fprintf(stderr, "  %s stopped: %s\n", r.label().c_str(), e.what());
        RunRecord failed;
        failed.config = r;
        failed.failure = e.what();
        records.push_back(std::move(failed));
      }
    }

    print_table(records);
    write_outputs(records, out_dir);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xpipe-train: %s\n", e.what());
    return 1;
  }
}
