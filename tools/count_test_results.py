#!/usr/bin/env python3
"""Counts test cases from Bazel's test results (bazel-testlogs/**/test.xml).

Usage: count_test_results.py TESTLOGS_DIR TARGET... -> prints `N passed, M failed`
(plus `, K skipped` when some were skipped) and exits 1 if anything failed.

Each target's GoogleTest XML gives its test cases. A target without XML (it crashed,
timed out or did not build) counts as one failed test. Skipped or disabled cases are
reported as skipped, never as passed.
"""
import os
import sys
import xml.etree.ElementTree as ET


def count_target(testlogs, target):
    pkg, _, name = target.lstrip("/").partition(":")
    base = os.path.join(testlogs, pkg, name)
    xml_path = os.path.join(base, "test.xml")
    if not os.path.exists(xml_path):
        return 0, 1, 0, [f"{target}: no test.xml (did not build or run)"]
    try:
        root = ET.parse(xml_path).getroot()
    except ET.ParseError as e:
        return 0, 1, 0, [f"{target}: unreadable test.xml: {e}"]
    passed = failed = skipped = 0
    failures = []
    cases = list(root.iter("testcase"))
    for case in cases:
        label = f"{target} {case.get('classname', '')}.{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            failures.append(label)
        elif (case.get("status") == "notrun" or case.get("result") in ("skipped", "suppressed")
              or case.find("skipped") is not None):
            skipped += 1
        else:
            passed += 1
    # Bazel writes a synthetic XML for a test that crashed or timed out: one case with an
    # <error>/<failure>, caught above. A suite-level error with no cases is a failure too.
    if not cases:
        errors = int(root.get("errors", "0") or 0) + int(root.get("failures", "0") or 0)
        if errors:
            return 0, 1, 0, [f"{target}: failed before running any test case"]
        return 0, 1, 0, [f"{target}: ran no test case"]
    return passed, failed, skipped, failures


def main(argv):
    testlogs, targets = argv[1], argv[2:]
    total_p = total_f = total_s = 0
    all_failures = []
    for target in targets:
        p, f, s, failures = count_target(testlogs, target)
        total_p += p
        total_f += f
        total_s += s
        all_failures += failures
    for line in all_failures:
        print("FAILED:", line)
    summary = f"{total_p} passed, {total_f} failed"
    if total_s:
        summary += f", {total_s} skipped"
    print(summary)
    return 1 if total_f else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
