// Concepts both ways: every shipped policy qualifies; near misses (one member short) do not.
#include <catch2/catch.hpp>
#include <string>
#include <string_view>
#include <type_traits>

#include "xpipe/xpipe.hpp"

using namespace xpipe;
using Catch::Contains;

namespace {
// A user layer that qualifies: doubles its input.
struct Twice {
  static constexpr int in_width = any_width, out_width = any_width;
  static constexpr index_t param_count = 0;
  static void init(std::span<float>, std::uint64_t) {}
  template <class Ctx>
  static void forward(const Ctx&, const float*, ConstMatrix x, Matrix y) {
    for (index_t i = 0; i < x.rows; ++i)
      for (index_t j = 0; j < x.cols; ++j) y(i, j) = 2 * x(i, j);
  }
  template <class Ctx>
  static void backward(const Ctx&, const float*, float*, bool, ConstMatrix, ConstMatrix,
                       ConstMatrix dy, Matrix dx) {
    for (index_t i = 0; i < dy.rows; ++i)
      for (index_t j = 0; j < dy.cols; ++j) dx(i, j) = 2 * dy(i, j);
  }
};
// Near miss: no backward.
struct NoBackward {
  static constexpr int in_width = 3, out_width = 3;
  static constexpr index_t param_count = 0;
  static void init(std::span<float>, std::uint64_t) {}
  static void forward(const HostContext&, const float*, ConstMatrix, Matrix) {}
};
// Near miss: no param_count.
struct NoParamCount {
  static constexpr int in_width = 3, out_width = 3;
  static void init(std::span<float>, std::uint64_t) {}
  static void forward(const HostContext&, const float*, ConstMatrix, Matrix) {}
  static void backward(const HostContext&, const float*, float*, bool, ConstMatrix, ConstMatrix,
                       ConstMatrix, Matrix) {}
};
// A user optimizer that qualifies: plain SGD without momentum.
struct PlainSgd {
  static constexpr int moment_count = 0;
  static constexpr const char* name = "plain";
  float lr = 0.1f;
  float learning_rate() const { return lr; }
  void step(const HostContext&, const FlatState& s) const {
    for (index_t i = 0; i < s.size; ++i) s.weights[i] -= lr * s.grads[i];
  }
  void direction(const HostContext&, const FlatState& s, float* d) const {
    for (index_t i = 0; i < s.size; ++i) d[i] = 0.f;  // no state: no foreseeable step
  }
  void predict(const HostContext&, const FlatState& s, float, float* out) const {
    for (index_t i = 0; i < s.size; ++i) out[i] = s.weights[i];
  }
};
// Near miss: no direction (cannot drive weight prediction).
struct NoDirection {
  static constexpr int moment_count = 0;
  static constexpr const char* name = "nodir";
  float learning_rate() const { return 0.1f; }
  void step(const HostContext&, const FlatState&) const {}
};
// Backend near miss: no Context.
struct NoContext {
  template <class T>
  using Buffer = HostBuffer<T>;
  static constexpr const char* name = "x";
};

// A small backend whose Context is not HostContext (host memory, so its buffers are real).
struct OtherContext {
  int device = 0;
};
struct OtherBackend {
  using Context = OtherContext;
  struct ContextOwner {
    explicit ContextOwner(const Placement&) {}
    const OtherContext& ctx() const { return ctx_; }
    OtherContext ctx_;
  };
  template <class T>
  using Buffer = HostBuffer<T>;
  static constexpr const char* name = "other";
  static constexpr index_t column_block = 1;
};

// A user predictor that qualifies: the live weights for everything, hooks from PredictorHooks.
struct UserLatest {
  static constexpr const char* name = "user-latest";
  template <class O, class B>
  struct State : PredictorHooks {
    explicit State(const PredictorSetup&) {}
    template <class Ctx>
    const float* forward_weights(const Ctx&, OptimizerState<O, B>& o, int) {
      return o.weights();
    }
    template <class Ctx>
    const float* backward_weights(const Ctx&, OptimizerState<O, B>& o, int) {
      return o.weights();
    }
    int weight_copies() const { return 1; }
  };
};
// Near miss: no constructor from PredictorSetup.
struct NoSetupConstructor {
  static constexpr const char* name = "no-ctor";
  template <class O, class B>
  struct State : PredictorHooks {
    State() = default;
    template <class Ctx>
    const float* forward_weights(const Ctx&, OptimizerState<O, B>& o, int) {
      return o.weights();
    }
    template <class Ctx>
    const float* backward_weights(const Ctx&, OptimizerState<O, B>& o, int) {
      return o.weights();
    }
    int weight_copies() const { return 1; }
  };
};
// Near miss: no backward_weights.
struct NoBackwardWeights {
  static constexpr const char* name = "no-bw";
  template <class O, class B>
  struct State : PredictorHooks {
    explicit State(const PredictorSetup&) {}
    template <class Ctx>
    const float* forward_weights(const Ctx&, OptimizerState<O, B>& o, int) {
      return o.weights();
    }
    int weight_copies() const { return 1; }
  };
};
// Near miss: a target that is not a StalenessTarget.
struct IntTarget : UserLatest {
  static constexpr int target = 1;
};
// Qualifies for OtherBackend only: every call takes OtherContext, never HostContext.
struct OtherOnly {
  static constexpr const char* name = "other-only";
  template <class O, class B>
  struct State : PredictorHooks {
    explicit State(const PredictorSetup&) {}
    const float* forward_weights(const OtherContext&, OptimizerState<O, B>& o, int) {
      return o.weights();
    }
    const float* backward_weights(const OtherContext&, OptimizerState<O, B>& o, int) {
      return o.weights();
    }
    void before_step(const OtherContext&, OptimizerState<O, B>&) {}
    int weight_copies() const { return 1; }
  };
};
// Qualifies with Adam only: its State exists for Adam alone.
struct AdamOnly {
  static constexpr const char* name = "adam-only";
  template <class O, class B>
  requires std::same_as<O, Adam>
  struct State : UserLatest::State<O, B> {
    using UserLatest::State<O, B>::State;
  };
};
// An optimizer for OtherBackend only.
struct OtherSgd : PlainSgd {
  void step(const OtherContext&, const FlatState&) const {}
  void direction(const OtherContext&, const FlatState&, float*) const {}
  void predict(const OtherContext&, const FlatState&, float, float*) const {}
};
}  // namespace

TEST_CASE("Layer concept accepts shipped and user layers - rejects near misses", "[concepts]") {
  STATIC_REQUIRE(Layer<Linear<3, 4>>);
  STATIC_REQUIRE(Layer<ReLU>);
  STATIC_REQUIRE(Layer<GELU>);
  STATIC_REQUIRE(Layer<Twice>);
  STATIC_REQUIRE_FALSE(Layer<NoBackward>);
  STATIC_REQUIRE_FALSE(Layer<NoParamCount>);
  STATIC_REQUIRE_FALSE(Layer<int>);
  // The user layer works inside a Stage.
  using S = Stage<Linear<2, 2>, Twice>;
  std::vector<float> w(S::param_count);
  S::init(w, 1);
  S::Activations<Host> a(1);
  std::vector<float> x{1.f, -1.f};
  const ConstMatrix y = S::forward(HostContext{}, w.data(), {x.data(), 1, 2}, a);
  REQUIRE(y(0, 0) == Approx(2 * (w[0] * 1 - w[2])));
}

TEST_CASE("Optimizer concept accepts shipped and user optimizers - rejects near misses",
          "[concepts]") {
  STATIC_REQUIRE(Optimizer<SGD>);
  STATIC_REQUIRE(Optimizer<Adam>);
  STATIC_REQUIRE(Optimizer<AdamW>);
  STATIC_REQUIRE(Optimizer<PlainSgd>);
  STATIC_REQUIRE_FALSE(Optimizer<NoDirection>);
  STATIC_REQUIRE_FALSE(Optimizer<Linear<2, 2>>);
  OptimizerState<PlainSgd, Host> st(PlainSgd{}, 2);
  st.weights()[0] = 1.f;
  st.grads()[0] = 2.f;
  st.step(HostContext{});
  REQUIRE(st.weights()[0] == Approx(0.8f));
}

TEST_CASE("Optimizer concept is probed on the backend's context", "[concepts]") {
  STATIC_REQUIRE(Backend<OtherBackend>);
  STATIC_REQUIRE(Optimizer<Adam, OtherBackend>);  // templates on the context: any backend
  STATIC_REQUIRE(Optimizer<OtherSgd, OtherBackend>);
  STATIC_REQUIRE_FALSE(Optimizer<OtherSgd>);
  STATIC_REQUIRE_FALSE(Optimizer<OtherSgd, Host>);
  STATIC_REQUIRE_FALSE(Optimizer<PlainSgd, OtherBackend>);
  STATIC_REQUIRE(check_optimizer<OtherSgd, OtherBackend>());
}

TEST_CASE(
    "Predictor concept accepts shipped and user predictors with Adam and SGD - rejects "
    "near misses",
    "[concepts]") {
  STATIC_REQUIRE(Predictor<Latest>);
  STATIC_REQUIRE(Predictor<Stash, SGD>);
  STATIC_REQUIRE(check_predictor<Latest>());  // Adam and SGD on the host
  STATIC_REQUIRE(check_predictor<Stash>());
  STATIC_REQUIRE(check_predictor<DoubleBuffered>());
  STATIC_REQUIRE(check_predictor<SpecTrain>());
  STATIC_REQUIRE(check_predictor<XPipe>());
  STATIC_REQUIRE(check_predictor<PipeOptim>());
  STATIC_REQUIRE(check_predictor<XPipe, AdamW, Host>());
  STATIC_REQUIRE(check_predictor<SpecTrain, AnyOptimizer, Host>());
  STATIC_REQUIRE(check_predictor<UserLatest>());
  STATIC_REQUIRE(Predictor<UserLatest, PlainSgd>);
  STATIC_REQUIRE_FALSE(Predictor<NoSetupConstructor>);
  STATIC_REQUIRE_FALSE(Predictor<NoSetupConstructor, SGD>);
  STATIC_REQUIRE_FALSE(Predictor<NoBackwardWeights>);
  STATIC_REQUIRE_FALSE(Predictor<NoBackwardWeights, SGD>);
  STATIC_REQUIRE_FALSE(Predictor<IntTarget>);
  STATIC_REQUIRE_FALSE(Predictor<Adam>);
  STATIC_REQUIRE_FALSE(Predictor<int>);
  // Probing more than one optimizer is what catches a predictor tied to one.
  STATIC_REQUIRE(Predictor<AdamOnly, Adam>);
  STATIC_REQUIRE_FALSE(Predictor<AdamOnly, SGD>);
  // What the shipped predictors say about themselves stays as it was.
  STATIC_REQUIRE(std::string_view(SpecTrain::name) == "spectrain");
  STATIC_REQUIRE(std::string_view(PipeOptim::name) == "pipeoptim");
  STATIC_REQUIRE(std::string_view(XPipe::name) == "xpipe");
  STATIC_REQUIRE(std::string_view(Stash::name) == "stash");
  STATIC_REQUIRE(std::string_view(DoubleBuffered::name) == "2bw");
  STATIC_REQUIRE(SpecTrain::target == StalenessTarget::RoundTrip);
  STATIC_REQUIRE(PipeOptim::target == StalenessTarget::ApplyTime);
  STATIC_REQUIRE(XPipe::target == StalenessTarget::ApplyTime);
}

TEST_CASE("Predictor concept is probed on the backend's context", "[concepts]") {
  STATIC_REQUIRE(Predictor<OtherOnly, Adam, OtherBackend>);
  STATIC_REQUIRE(Predictor<OtherOnly, SGD, OtherBackend>);
  STATIC_REQUIRE(check_predictor<OtherOnly, Adam, OtherBackend>());
  STATIC_REQUIRE_FALSE(Predictor<OtherOnly>);
  STATIC_REQUIRE_FALSE(Predictor<OtherOnly, Adam, Host>);
  // Generic predictors qualify on any backend.
  STATIC_REQUIRE(Predictor<XPipe, Adam, OtherBackend>);
  STATIC_REQUIRE(Predictor<UserLatest, SGD, OtherBackend>);
}

TEST_CASE("Backend concept accepts the host backend - rejects a near miss", "[concepts]") {
  STATIC_REQUIRE(Backend<Host>);
  STATIC_REQUIRE_FALSE(Backend<NoContext>);
  STATIC_REQUIRE(std::is_same_v<DefaultBackend, Host>);
}

TEST_CASE("Name lists: every listed schedule, predictor and optimizer is found by its name",
          "[concepts]") {
  for (const char* name : schedule_names) {
    INFO(name);
    CHECK(make_schedule(name, 4, 4, 2).name == name);
  }
  for (const char* name : optimizer_names) {
    INFO(name);
    CHECK(std::string_view(make_optimizer(name, 0.1f).chosen_name()) == name);
  }
  // with_predictor hands over the type whose own name matches, for each name in the list.
  for (const char* name : predictor_names) {
    INFO(name);
    const std::string found =
        with_predictor(name, []<class P>(std::type_identity<P>) { return std::string(P::name); });
    CHECK(found == name);
  }
  CHECK(with_predictor("stash",
                       []<class P>(std::type_identity<P>) { return std::is_same_v<P, Stash>; }));
  CHECK(with_predictor("xpipe",
                       []<class P>(std::type_identity<P>) { return std::is_same_v<P, XPipe>; }));
  REQUIRE_THROWS_WITH(with_predictor("lookahead", [](auto) { return 0; }),
                      Contains("unknown predictor 'lookahead'") &&
                          Contains("latest, stash, 2bw, spectrain, xpipe, pipeoptim, pipenag, "
                                   "pipenag-k, pipemare, multistep, fit-linear, fit-quadratic, "
                                   "2bw-ef, paci, dc-asgd"));
  REQUIRE_THROWS_WITH(make_optimizer("lamb", 0.1f),
                      Contains("unknown optimizer 'lamb'") && Contains("sgd, adam, adamw"));
  REQUIRE_THROWS_WITH(
      make_schedule("zb-h3", 2, 2, 2),
      Contains("gpipe, 1f1b-flush, async-1f1b, 2bw, zb-h1, zb-h2, zb-auto, async-zb, "
               "interleaved-1f1b, "
               "looped-bfs, async-interleaved, zb-v, dualpipev"));
}
