// xpipe-plan measure-efficiency: E(B), the epochs sequential training takes to a target test
// accuracy at each global batch B, over seeds -> the E(B) JSON the planner reads.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "output_files.hpp"
#include "plan/common.hpp"
#include "plan/runs.hpp"
#include "plan/subcommands.hpp"
#include "xpipe/data/dataset.hpp"

namespace xpipe::tools::plan {
namespace {

struct Options {
  std::string batches = "32,64,128,256,512,1024", seeds = "1";
  std::string out = "xpipe-plan-out/efficiency.json", data_dir = default_fashion_mnist_dir();
  double target = 0.85, max_epochs = 8;
  int evals_per_epoch = 4, jobs = 1;
  float lr = 1e-3f;
};

//! E(B) over seeds: every (batch, seed) run is independent and deterministic, so `jobs` threads
//! take them in turn and the numbers do not depend on how many run at once. A batch's point is
//! the mean over its seeds (all must reach the target, else it is listed as not reached, with
//! each seed's outcome); the file is rewritten after every finished run, so an interrupted
//! measurement keeps what it finished ("pending" lists the batches still missing seeds).
int measure(const fs::path& out, const std::vector<int>& batches, const std::vector<int>& seeds,
            int jobs, double target, double max_epochs, int evals_per_epoch, float lr,
            const std::string& data_dir) {
  for (const auto* list : {&batches, &seeds}) {
    std::vector<int> sorted = *list;
    std::sort(sorted.begin(), sorted.end());
    if (const auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end())
      throw UsageError(std::string(list == &batches ? "--batches" : "--seeds") + ": " +
                       std::to_string(*d) + " is listed twice");
  }
  prepare_out_file(out);
  const DatasetPair data = load_fashion_mnist(data_dir);
  std::printf(
      "E(B): epochs to %.1f%% test accuracy on Fashion-MNIST, sequential MLP, Adam lr %g, "
      "checked %d times an epoch, at most %.0f epochs, seeds",
      100 * target, lr, evals_per_epoch, max_epochs);
  for (int s : seeds) std::printf(" %d", s);
  std::printf(", %d run%s at a time\n", jobs, jobs == 1 ? "" : "s");
  std::fflush(stdout);

  struct Run {
    bool done = false;
    double epochs = -1, last_accuracy = 0;
  };
  const std::size_t S = seeds.size();
  std::vector<Run> runs(batches.size() * S);  // batch-major
  std::mutex lock;                            // guards runs, the file and stdout
  const std::string target_text = "test accuracy >= " + std::to_string(target) +
                                  " on Fashion-MNIST (reference MLP, Adam lr " +
                                  std::to_string(lr) + ", sequential)";
  // Batch b's runs so far: each finished seed's outcome, and over them the mean, least and most
  // epochs (meaningful once every seed is done and reached the target).
  struct Summary {
    json per_seed = json::array();
    bool done = true, reached = true;
    double mean = 0, lo = 1e300, hi = -1e300;
  };
  auto summarize = [&](std::size_t b) {
    Summary m;
    for (std::size_t s = 0; s < S; ++s) {
      const Run& r = runs[b * S + s];
      m.done = m.done && r.done;
      if (!r.done) continue;
      m.per_seed.push_back({{"seed", seeds[s]},
                            {"epochs", r.epochs > 0 ? json(r.epochs) : json(nullptr)},
                            {"last_accuracy", r.last_accuracy}});
      m.reached = m.reached && r.epochs > 0;
      m.mean += r.epochs;  // a sum until the loop ends
      m.lo = std::min(m.lo, r.epochs);
      m.hi = std::max(m.hi, r.epochs);
    }
    m.mean /= static_cast<double>(S);
    return m;
  };
  auto write = [&] {  // with lock held
    json pts = json::array(), missed = json::array(), pending = json::array();
    for (std::size_t b = 0; b < batches.size(); ++b) {
      const Summary m = summarize(b);
      if (!m.done)
        pending.push_back({{"batch", batches[b]}, {"per_seed", m.per_seed}});
      else if (!m.reached)
        missed.push_back({{"batch", batches[b]}, {"per_seed", m.per_seed}});
      else
        pts.push_back({{"batch", batches[b]},
                       {"epochs", m.mean},
                       {"epochs_min", m.lo},
                       {"epochs_max", m.hi},
                       {"per_seed", m.per_seed}});
    }
    json j{{"target", target_text},
           {"dataset_samples", data.train.count},
           {"evals_per_epoch", evals_per_epoch},
           {"seeds", seeds},
           {"points", pts},
           {"not_reached", missed},
           {"measured_on", machine_note()}};
    if (!pending.empty()) j["pending"] = pending;
    write_file_atomically(out, j.dump(2) + "\n");
  };

  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  auto work = [&] {
    try {
      for (std::size_t i; !failed && (i = next++) < runs.size();) {
        const int B = batches[i / S], seed = seeds[i % S];
        double last = 0;
        const double epochs = epochs_to_target(data, B, static_cast<std::uint64_t>(seed), target,
                                               max_epochs, evals_per_epoch, lr, last);
        const std::lock_guard<std::mutex> g(lock);
        runs[i] = {true, epochs, last};
        if (epochs > 0)
          std::printf("  B = %5d, seed %d: %.2f epochs\n", B, seed, epochs);
        else
          std::printf("  B = %5d, seed %d: not reached in %.0f epochs (last %.2f%%)\n", B, seed,
                      max_epochs, 100 * last);
        std::fflush(stdout);
        write();
      }
    } catch (...) {
      const std::lock_guard<std::mutex> g(lock);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  {
    std::vector<std::jthread> pool;
    for (int j = 1; j < std::min<int>(jobs, static_cast<int>(runs.size())); ++j)
      pool.emplace_back(work);
    work();
  }
  if (error) std::rethrow_exception(error);
  std::printf("\n| B | epochs (mean over %zu seed%s) | min | max |\n|--:|--:|--:|--:|\n", S,
              S == 1 ? "" : "s");
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const Summary m = summarize(b);
    if (m.reached)
      std::printf("| %d | %.2f | %.2f | %.2f |\n", batches[b], m.mean, m.lo, m.hi);
    else
      std::printf("| %d | not reached by every seed | | |\n", batches[b]);
  }
  std::printf("  wrote %s\n", out.c_str());
  return 0;
}

int run(const Options& o) {
  const std::vector<int> seeds = parse_ints("--seeds", o.seeds, 0);
  const std::vector<int> batches = parse_ints("--batches", o.batches, 1);
  return measure(o.out, batches, seeds, o.jobs, o.target, o.max_epochs, o.evals_per_epoch, o.lr,
                 o.data_dir);
}

}  // namespace

Subcommand add_measure_efficiency(CLI::App& app) {
  auto* cli = app.add_subcommand("measure-efficiency", "epochs to a target accuracy vs batch");
  auto o = std::make_shared<Options>();
  cli->add_option("--batches", o->batches, "global batch sizes");
  cli->add_option("--seeds", o->seeds, "seeds; a batch's point is the mean over them");
  cli->add_option("--jobs,-j", o->jobs, "runs at a time (one thread each; same numbers)")
      ->check(CLI::Range(1, 256));
  cli->add_option("--target", o->target, "test accuracy to reach")
      ->check(decimal_in(0.1, 1, "[0.1, 1]"));
  cli->add_option("--max-epochs", o->max_epochs, "give up after")
      ->check(decimal_in(1, 1000, "[1, 1000]"));
  cli->add_option("--evals-per-epoch", o->evals_per_epoch, "accuracy checks per epoch")
      ->check(CLI::Range(1, 1000));
  cli->add_option("--lr", o->lr, "Adam learning rate")->check(decimal_in(1e-8, 10, "[1e-8, 10]"));
  cli->add_option("--data-dir", o->data_dir, "Fashion-MNIST IDX folder");
  cli->add_option("--out,-o", o->out, "E(B) JSON to write");
  return {cli, [o] { return run(*o); }};
}

}  // namespace xpipe::tools::plan
