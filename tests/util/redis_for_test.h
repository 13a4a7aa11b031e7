// A redis-server for tests, so that no test depends on being run through tools/test.sh
// and none passes by skipping: the one in RLFLEET_REDIS_PORT when it is set (CI and
// tools/test.sh start one), else one started here (a Subprocess on a free loopback port,
// once per test process, its data in memory only), killed and reaped at exit.
#ifndef RLFLEET_TESTS_UTIL_REDIS_FOR_TEST_H_
#define RLFLEET_TESTS_UTIL_REDIS_FOR_TEST_H_

#include "absl/status/statusor.h"

namespace rlfleet::testing {

// The port of a redis-server on 127.0.0.1 that answers PING. Errors when
// redis-server is not installed or does not answer within 10 s.
absl::StatusOr<int> RedisPortForTest();

}  // namespace rlfleet::testing

#endif  // RLFLEET_TESTS_UTIL_REDIS_FOR_TEST_H_
