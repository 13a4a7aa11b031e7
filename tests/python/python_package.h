// The rlfleet Python package as setup.py makes it, for tests that start its processes:
// the sources from the runfiles with their stubs generated from proto/, under
// TEST_TMPDIR, plus one module of the test's own.
#ifndef RLFLEET_TESTS_PYTHON_PYTHON_PACKAGE_H_
#define RLFLEET_TESTS_PYTHON_PYTHON_PACKAGE_H_

#include <string>

namespace rlfleet::testing {

// Prepares the package once per test process (later calls find it) and writes
// `module`.py with `source` beside it; returns the directory for PYTHONPATH. A protoc
// failure is a test failure.
std::string PreparePythonPackage(const std::string& module, const std::string& source);

}  // namespace rlfleet::testing

#endif  // RLFLEET_TESTS_PYTHON_PYTHON_PACKAGE_H_
