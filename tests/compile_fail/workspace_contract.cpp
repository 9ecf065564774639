// Must not compile: a layer whose Workspace<B> its slots' Saved<B> cannot be built on (so each
// slot would keep its own), or, with XPIPE_ARENA_WITHOUT_CONSTRUCTOR, one that asks the stage's
// arena without a Workspace<B> built on it; Stage::Workspace names the missing constructor.
#include "xpipe/xpipe.hpp"

struct Scratchy {
  static constexpr int in_width = 4, out_width = 4;
  static constexpr xpipe::index_t param_count = 0;
  static void init(std::span<float>, std::uint64_t) {}
  template <class B>
  struct Workspace {
    explicit Workspace(xpipe::index_t) {}
#ifdef XPIPE_ARENA_WITHOUT_CONSTRUCTOR
    Workspace(xpipe::index_t, Workspace*) {}  // a near miss: not (rows, float* arena)
#endif
  };
  template <class B>
  struct Saved {
    explicit Saved(xpipe::index_t) {}
#ifdef XPIPE_ARENA_WITHOUT_CONSTRUCTOR
    Saved(xpipe::index_t, Workspace<B>&) {}
#endif
  };
#ifdef XPIPE_ARENA_WITHOUT_CONSTRUCTOR
  template <class B>
  static constexpr xpipe::index_t arena_floats(xpipe::index_t rows) {
    return rows;
  }
#endif
  template <class Ctx, class S>
  static void forward(const Ctx&, const float*, xpipe::ConstMatrix, xpipe::Matrix, S&) {}
  template <class Ctx, class S>
  static void backward(const Ctx&, const float*, float*, bool, xpipe::ConstMatrix,
                       xpipe::ConstMatrix, xpipe::ConstMatrix, xpipe::Matrix, S&) {}
};

int main() {
  xpipe::Stage<Scratchy>::Workspace<xpipe::Host> workspace(4);
  return static_cast<int>(workspace.max_rows());
}
