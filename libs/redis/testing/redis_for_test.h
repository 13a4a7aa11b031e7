// A redis-server for tests, so that no test depends on being run through tools/test.sh
// and none passes by skipping: the one in RLFLEET_REDIS_PORT when it is set (CI and
// tools/test.sh start one), else one started here on a free loopback port (once per
// test process, its data in memory only), stopped by pid when the process exits.
#ifndef RLFLEET_LIBS_REDIS_TESTING_REDIS_FOR_TEST_H_
#define RLFLEET_LIBS_REDIS_TESTING_REDIS_FOR_TEST_H_

#include "absl/status/statusor.h"

namespace rlfleet::redis::testing {

// The port of a redis-server on 127.0.0.1 that answers PING. Errors when
// redis-server is not installed or does not start within 10 s.
absl::StatusOr<int> RedisPortForTest();

}  // namespace rlfleet::redis::testing

#endif  // RLFLEET_LIBS_REDIS_TESTING_REDIS_FOR_TEST_H_
