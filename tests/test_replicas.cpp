// replica_rows: the rows each data-parallel replica trains on, checked against splits counted by
// hand.
#include <catch2/catch.hpp>
#include <vector>

#include "xpipe/pipeline/replicas.hpp"

using namespace xpipe;
using Catch::Contains;
using Rows = std::vector<index_t>;

TEST_CASE("replica_rows takes each replica's part of every global micro-batch", "[replicas]") {
  // 40 rows, batch 16, M = 2: micro-batches 0-7, 8-15 | 16-23, 24-31 | tail 32-39 left out.
  CHECK(replica_rows(40, 16, 2, 2, 0) ==
        Rows{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27});
  CHECK(replica_rows(40, 16, 2, 2, 1) ==
        Rows{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
  // One replica: every row of every full mini-batch, in order.
  CHECK(replica_rows(5, 2, 1, 1, 0) == Rows{0, 1, 2, 3});
  // Uneven: batch 6, M = 2 gives micro-batches of 3 rows; 2 replicas take 2 and 1 of each.
  CHECK(replica_rows(6, 6, 2, 2, 0) == Rows{0, 1, 3, 4});
  CHECK(replica_rows(6, 6, 2, 2, 1) == Rows{2, 5});
}

TEST_CASE("replica_rows refuses replicas that do not divide the batch", "[replicas]") {
  REQUIRE_THROWS_WITH(replica_rows(100, 7, 1, 2, 0),
                      Contains("2 replicas do not divide the batch of 7 rows"));
}
