// AnyPredictor: any built-in predictor chosen at run time, with its hyper-parameters as values,
// the predictor counterpart of AnyOptimizer. Tools compile one Pipeline type per model split with
// it instead of one per predictor; a user's own predictors join the list in one line.
#pragma once

#include <cmath>
#include <cstddef>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "xpipe/core/error.hpp"
#include "xpipe/predict/builtin.hpp"
#include "xpipe/predict/predictor.hpp"

namespace xpipe {

namespace detail {
template <class P>
concept HasHyperParameters = requires(P& p) {
  p.hyper_parameters([](const char*, auto&, HyperRange) {});
};

inline std::string range_text(const HyperRange& r, bool integer) {
  std::ostringstream out;
  out << (r.low_open ? "(" : "[") << r.low << ", " << r.high << (r.high_open ? ")" : "]");
  if (integer) out << ", an integer";
  return out.str();
}
}  // namespace detail

//! Calls f(key, value, range) for each of predictor p's hyper-parameters (none for predictors
//! without a hyper_parameters member); value is a float& or int& into p.
template <class P, class F>
void for_each_hyper_parameter(P& p, F&& f) {
  if constexpr (detail::HasHyperParameters<P>) p.hyper_parameters(f);
}

//! Sets predictor p's hyper-parameter `key` to `value`. ConfigError naming the predictor, the key
//! and what it accepts when the key is unknown, the value not finite, outside its range, or not
//! an integer where the member is one.
//! Usage: `PipeNAG p; set_hyper_parameter(p, "momentum", 0.95);`
template <class P>
void set_hyper_parameter(P& p, std::string_view key, double value) {
  bool found = false;
  std::string keys;
  for_each_hyper_parameter(p, [&](const char* k, auto& member, HyperRange range) {
    keys += (keys.empty() ? "" : ", ") + std::string(k);
    if (key != k) return;
    found = true;
    constexpr bool integer = std::is_integral_v<std::remove_reference_t<decltype(member)>>;
    if (!std::isfinite(value) || !range.contains(value) || (integer && value != std::floor(value)))
      throw ConfigError("xpipe: predictor '" + std::string(P::name) + "': " + std::string(k) +
                        " must be in " + detail::range_text(range, integer) + " (got " +
                        detail::number_text(value) + ")");
    member = static_cast<std::remove_reference_t<decltype(member)>>(value);
  });
  if (!found)
    throw ConfigError("xpipe: predictor '" + std::string(P::name) + "' has no hyper-parameter '" +
                      std::string(key) + "' (" +
                      (keys.empty() ? std::string("it has none") : "it has: " + keys) + ")");
}

//! The keys of p's hyper-parameters, in declaration order (none without any).
template <class P>
std::vector<std::string> hyper_parameter_names(const P& p) {
  P copy = p;  // hyper_parameters() hands out mutable references
  std::vector<std::string> out;
  for_each_hyper_parameter(copy, [&](const char* k, auto&, HyperRange) { out.emplace_back(k); });
  return out;
}

//! "key=value,key=value" of p's hyper-parameters in declaration order ("" without any), for
//! labels and checkpoint fields. Usage: `hyper_parameter_text(PipeNAG{})` is "momentum=0.99".
template <class P>
std::string hyper_parameter_text(const P& p) {
  P copy = p;  // hyper_parameters() hands out mutable references
  std::ostringstream out;
  for_each_hyper_parameter(copy, [&](const char* k, auto& member, HyperRange) {
    out << (out.tellp() > 0 ? "," : "") << k << '=' << member;
  });
  return out.str();
}

//! One of predictors P... chosen at run time (AnyPredictor: the built-in ones), holding the
//! chosen predictor's value with its hyper-parameters. A Predictor like any other: its State
//! holds the chosen predictor's State and forwards each call to it (one dispatch per action, no
//! per-element cost). Usage:
//!   `Pipeline<S0, S1, AnyPredictor, AnyOptimizer> p(opt, options, make_predictor("pipenag"));`
//!   `AnyPredictor pred{PipeNAG{.momentum = 0.95f}};`
template <class... P>
struct AnyPredictorOf {
  static_assert(sizeof...(P) > 0, "xpipe: AnyPredictorOf: name at least one predictor");
  static constexpr const char* name = "any";
  std::variant<P...> impl;

  //! The chosen predictor's name ("xpipe", ...).
  const char* chosen_name() const {
    return std::visit([](const auto& p) { return std::remove_cvref_t<decltype(p)>::name; }, impl);
  }
  //! set_hyper_parameter on the chosen predictor.
  void set(std::string_view key, double value) {
    std::visit([&](auto& p) { set_hyper_parameter(p, key, value); }, impl);
  }
  //! hyper_parameter_names of the chosen predictor.
  std::vector<std::string> hyper_names() const {
    return std::visit([](const auto& p) { return hyper_parameter_names(p); }, impl);
  }
  //! Whether the chosen predictor has hyper-parameter `key`.
  bool has_hyper_parameter(std::string_view key) const {
    for (const std::string& k : hyper_names())
      if (k == key) return true;
    return false;
  }
  //! hyper_parameter_text of the chosen predictor.
  std::string hyper_text() const {
    return std::visit([](const auto& p) { return hyper_parameter_text(p); }, impl);
  }

  template <class O, class B>
  class State {
   public:
    State(const PredictorSetup& setup, const AnyPredictorOf& chosen) {
      build(setup, chosen, std::index_sequence_for<P...>{});
    }

    template <class Ctx>
    const float* forward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      return visit([&](auto& s) { return s.forward_weights(ctx, opt, g); });
    }
    template <class Ctx>
    const float* backward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      return visit([&](auto& s) { return s.backward_weights(ctx, opt, g); });
    }
    void backward_done(int g) {
      visit([&](auto& s) { s.backward_done(g); });
    }
    template <class Ctx>
    void before_step(const Ctx& ctx, OptimizerState<O, B>& opt) {
      visit([&](auto& s) { s.before_step(ctx, opt); });
    }
    //! The chosen State's apply_step, or the optimizer's own step where it has none.
    template <class Ctx>
    bool apply_step(const Ctx& ctx, OptimizerState<O, B>& opt) {
      return visit([&]<class S>(S& s) {
        if constexpr (detail::HasApplyStep<S, O, B>) {
          return static_cast<bool>(s.apply_step(ctx, opt));
        } else {
          opt.step(ctx);
          return true;
        }
      });
    }
    int weight_copies() const {
      return std::visit(
          [](const auto& s) {
            if constexpr (std::is_same_v<std::remove_cvref_t<decltype(s)>, std::monostate>)
              return 0;
            else
              return s.weight_copies();
          },
          impl_);
    }
    //! The chosen predictor's State if it is predictor Q's, else nullptr (for tests and probes).
    template <class Q>
    typename Q::template State<O, B>* chosen_state() {
      return std::get_if<typename Q::template State<O, B>>(&impl_);
    }

   private:
    template <std::size_t... I>
    void build(const PredictorSetup& setup, const AnyPredictorOf& chosen,
               std::index_sequence<I...>) {
      const std::size_t which = chosen.impl.index();
      ((which == I ? (emplace<I>(setup, std::get<I>(chosen.impl)), true) : false) || ...);
    }
    template <std::size_t I, class Q>
    void emplace(const PredictorSetup& setup, const Q& q) {
      // Built in place: a State need be neither copyable nor movable.
      if constexpr (detail::TakesPredictorValue<typename Q::template State<O, B>, Q>)
        impl_.template emplace<I + 1>(setup, q);
      else
        impl_.template emplace<I + 1>(setup);
    }
    // The monostate never survives the constructor (every alternative is built there).
    template <class F>
    decltype(auto) visit(F&& f) {
      return std::visit(
          [&]<class S>(S& s) -> decltype(auto) {
            if constexpr (std::is_same_v<S, std::monostate>)
              return f(std::get<1>(impl_));  // unreachable; typed like the others
            else
              return f(s);
          },
          impl_);
    }

    std::variant<std::monostate, typename P::template State<O, B>...> impl_;
  };
};

namespace detail {
template <class Tuple, class... Extra>
struct AnyOfTuple;
template <class... P, class... Extra>
struct AnyOfTuple<std::tuple<P...>, Extra...> {
  using type = AnyPredictorOf<P..., Extra...>;
};
}  // namespace detail

//! Every built-in predictor (BuiltinPredictors), chosen at run time.
using AnyPredictor = typename detail::AnyOfTuple<BuiltinPredictors>::type;

//! The built-in predictors and the user's own, chosen at run time: registering a predictor is
//! one line. Usage: `using MyAny = AnyPredictorWith<MyPredictor>;` then
//! `make_predictor<MyAny>("mine")`.
template <class... Mine>
using AnyPredictorWith = typename detail::AnyOfTuple<BuiltinPredictors, Mine...>::type;

namespace detail {
template <class... P>
std::string any_names(std::variant<P...>*) {
  std::string out;
  ((out += (out.empty() ? "" : ", ") + std::string(P::name)), ...);
  return out;
}
}  // namespace detail

//! The predictor named `name` of Any's list (AnyPredictor: the built-in ones), with its default
//! hyper-parameters; ConfigError naming the choices otherwise.
//! Usage: `AnyPredictor p = make_predictor("pipenag"); p.set("momentum", 0.95);`
template <class Any = AnyPredictor>
Any make_predictor(const std::string& name) {
  using Variant = decltype(Any::impl);
  std::optional<Any> out;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((name == std::variant_alternative_t<I, Variant>::name
          ? (out.emplace(Any{Variant{std::in_place_index<I>}}), true)
          : false) ||
     ...);
  }
  (std::make_index_sequence<std::variant_size_v<Variant>>{});
  if (!out)
    throw ConfigError("xpipe: unknown predictor '" + name +
                      "' (available: " + detail::any_names(static_cast<Variant*>(nullptr)) + ")");
  return *out;
}

static_assert(Predictor<AnyPredictor>);
static_assert(Predictor<AnyPredictor, SGD>);

}  // namespace xpipe
