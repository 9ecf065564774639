// A user-written predictor plugged into xpipe without touching the library: linear
// extrapolation from the last two weight versions, W_hat = W_t + s (W_t - W_{t-1}), with s the
// apply-time staleness the library derives from the schedule. Registered into AnyPredictor in
// one line, so one compiled Pipeline runs it beside the built-in predictors: trains the 4-stage
// MLP on Fashion-MNIST with async 1F1B and compares it with no remedy (Latest) and XPipe.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "xpipe/xpipe.hpp"

// The predictor: a name and a per-stage State, as the xpipe::Predictor concept asks
// (docs/contributing.md, "Add a predictor"). Its loops run on the host, so its calls take
// HostContext: it qualifies for the Host backend only, and xpipe::Predictor<LinearExtrapolation, O,
// Cuda> is false rather than a crash on device pointers.
struct LinearExtrapolation {
  static constexpr const char* name = "linear-extrapolation";
  // Optional: which s it extrapolates over, read below as analysis->forward(k, g).s(target).
  static constexpr xpipe::StalenessTarget target = xpipe::StalenessTarget::ApplyTime;

  template <class O, class B>
  class State : public xpipe::PredictorHooks {  // no-op backward_done; before_step below
   public:
    // Every buffer is allocated here, once: nothing allocates while training.
    explicit State(const xpipe::PredictorSetup& setup)
        : setup_(setup), previous_(setup.params), predicted_(setup.params) {}

    // Forward reads the weights extrapolated over its apply-time staleness s. The pointer stays
    // valid until the next call on this State, which is all the pipeline needs.
    const float* forward_weights(const xpipe::HostContext&, xpipe::OptimizerState<O, B>& opt,
                                 int g) {
      const int s = setup_.analysis->forward(setup_.stage, g).s(target);
      if (s == 0 || opt.steps_taken() == 0) return opt.weights();
      const float* w = opt.weights();
      for (xpipe::index_t i = 0; i < setup_.params; ++i)
        predicted_[i] = w[i] + static_cast<float>(s) * (w[i] - previous_[i]);
      return predicted_.data();
    }
    // Backward reads the live weights (as PipeOptim does).
    const float* backward_weights(const xpipe::HostContext&, xpipe::OptimizerState<O, B>& opt,
                                  int) {
      return opt.weights();
    }
    // Called just before the optimizer overwrites the live weights: remember them.
    void before_step(const xpipe::HostContext&, xpipe::OptimizerState<O, B>& opt) {
      std::copy(opt.weights(), opt.weights() + setup_.params, previous_.data());
    }
    int weight_copies() const { return 3; }  // live, previous, predicted

   private:
    xpipe::PredictorSetup setup_;
    xpipe::HostBuffer<float> previous_, predicted_;
  };
};
// One readable message per missing member; checked with Adam and with SGD on the host.
static_assert(xpipe::check_predictor<LinearExtrapolation>());

// The one line that registers it: every built-in predictor and this one, chosen by name at run
// time (xpipe::make_predictor<Choice>("linear-extrapolation")).
using Choice = xpipe::AnyPredictorWith<LinearExtrapolation>;

using xpipe::Linear;
using xpipe::ReLU;
using xpipe::Stage;
using S0 = Stage<Linear<784, 1024>, ReLU>;
using S1 = Stage<Linear<1024, 1024>, ReLU>;
using S2 = Stage<Linear<1024, 1024>, ReLU>;
using S3 = Stage<Linear<1024, 10>>;

// One Pipeline type for every predictor: the choice is a value.
using Mlp = xpipe::Pipeline<S0, S1, S2, S3, Choice, xpipe::Adam>;

void train(const xpipe::DatasetPair& data, const std::string& predictor, int epochs, int M,
           float lr) {
  Mlp pipe(xpipe::Adam{.lr = lr}, {.batch = 128, .micro_batches = M},
           xpipe::make_predictor<Choice>(predictor));
  xpipe::Batcher batcher(data.train, 128, 1);
  xpipe::HostBuffer<float> x(data.train.count * data.train.width);
  xpipe::HostBuffer<std::int32_t> y(data.train.count);
  const xpipe::Matrix xm{x.data(), data.train.count, data.train.width};
  const auto schedule =
      xpipe::async_1f1b(4, M, static_cast<int>(pipe.mini_batches_for(data.train.count)));
  xpipe::ThreadedExecutor exec;
  for (int e = 1; e <= epochs; ++e) {
    batcher.gather_epoch(e, xm, y.data());
    const auto r = pipe.train(schedule, {xm, y.data()}, exec);
    std::printf("%-22s epoch %d  loss %.4f  test accuracy %.2f%%  %.0f samples/s\n",
                pipe.predictor_policy().chosen_name(), e, r.loss, 100 * pipe.evaluate(data.test),
                r.samples / r.seconds);
  }
}

int main(int argc, char** argv) {
  CLI::App app{"A user-written predictor (linear extrapolation) in an async 4-stage pipeline"};
  int epochs = 1, M = 1;
  long train_samples = 0, test_samples = 0;
  float lr = 1e-3f;
  std::vector<std::string> predictors{"latest", LinearExtrapolation::name, "xpipe"};
  std::string dir = xpipe::default_fashion_mnist_dir();
  app.add_option("--epochs", epochs, "Epochs")->check(CLI::Range(1, 100));
  app.add_option("--micro-batches,-M", M, "Micro-batches per mini-batch")
      ->check(CLI::Range(1, 128));
  app.add_option("--lr", lr, "Adam learning rate")->check(CLI::PositiveNumber);
  app.add_option("--data-dir", dir, "Fashion-MNIST directory");
  app.add_option("--predictors", predictors, "Predictors to compare, a comma list")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--train-samples", train_samples, "Train on the first N samples (0: all)")
      ->check(CLI::Range(0L, 60000L));
  app.add_option("--test-samples", test_samples, "Test on the first N samples (0: all)")
      ->check(CLI::Range(0L, 10000L));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return e.get_exit_code() == 0 ? code : 2;
  }
  try {
    for (const std::string& p : predictors) xpipe::make_predictor<Choice>(p);  // names first
    const auto data =
        xpipe::load_fashion_mnist(dir, {.train = train_samples, .test = test_samples});
    for (const std::string& p : predictors) train(data, p, epochs, M, lr);
  } catch (const xpipe::ConfigError& e) {
    std::fprintf(stderr, "custom_predictor: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_predictor: %s\n", e.what());
    return 1;
  }
}
