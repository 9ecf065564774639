// The predictors xpipe ships, as one list: tools that pick a predictor by name at run time
// (xpipe-train's --predictor) dispatch over it instead of repeating the names.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "xpipe/core/error.hpp"
#include "xpipe/predict/accumulate.hpp"
#include "xpipe/predict/delay_compensation.hpp"
#include "xpipe/predict/error_feedback.hpp"
#include "xpipe/predict/extrapolate.hpp"
#include "xpipe/predict/history.hpp"
#include "xpipe/predict/latest.hpp"
#include "xpipe/predict/multistep.hpp"
#include "xpipe/predict/pipemare.hpp"
#include "xpipe/predict/pipenag.hpp"
#include "xpipe/predict/stash.hpp"
#include "xpipe/predict/xpipe.hpp"

namespace xpipe {

//! Every built-in predictor, in the order tools list them.
using BuiltinPredictors =
    std::tuple<Latest, Stash, DoubleBuffered, SpecTrain, XPipe, PipeOptim, PipeNAG, PipeNAGStaged,
               PipeMare, MultiStep, FitLinear, FitQuadratic, DoubleBufferedEF, AccumulateToBound,
               DelayCompensated>;

namespace detail {
template <class... P>
constexpr std::array<const char*, sizeof...(P)> names_of(std::tuple<P...>*) {
  return {P::name...};
}
}  // namespace detail

//! Their names ("latest", "stash", "2bw", "spectrain", "xpipe", "pipeoptim", "pipenag",
//! "pipenag-k", "pipemare", "multistep", "fit-linear", "fit-quadratic", "2bw-ef", "paci",
//! "dc-asgd").
inline constexpr auto predictor_names = detail::names_of(static_cast<BuiltinPredictors*>(nullptr));

//! Calls f(std::type_identity<P>{}) for the built-in predictor P named `name` and returns what it
//! returns; ConfigError naming the choices otherwise. Usage:
//! `with_predictor(name, [&]<class P>(std::type_identity<P>) { return run<Pipeline<S, P, O>>();
//! });`
template <class F>
decltype(auto) with_predictor(const std::string& name, F&& f) {
  using Result = decltype(f(std::type_identity<Latest>{}));
  return [&]<class... P>(std::tuple<P...>*) -> Result {
    if constexpr (std::is_void_v<Result>) {
      if (((name == P::name ? (f(std::type_identity<P>{}), true) : false) || ...)) return;
    } else {
      std::optional<Result> out;
      ((name == P::name ? (out.emplace(f(std::type_identity<P>{})), true) : false) || ...);
      if (out) return std::move(*out);
    }
    throw ConfigError("xpipe: unknown predictor '" + name +
                      "' (available: " + join_names(predictor_names) + ")");
  }(static_cast<BuiltinPredictors*>(nullptr));
}

}  // namespace xpipe
