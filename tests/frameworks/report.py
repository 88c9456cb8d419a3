"""Turns the suite's JUnit XML files (one per column) into a test x column table of pass/fail, followed by the
first line of each failure's error, and exits non-zero when a required column has anything but passes.

usage: report.py [--markdown] [--require COL,...] NAME=results.xml ...
A column whose XML is missing (its mount never came up) counts as failed everywhere.
"""
import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET


def load(path):
    """{test name: (status, message)} from one JUnit file; status is pass, fail, error or skip."""
    if not os.path.exists(path):
        return None
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        status, message = "pass", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                status = {"failure": "fail", "error": "error", "skipped": "skip"}[kind]
                # The element's text is the whole report (one line with --tb=line); the message attribute
                # is cut at a few hundred characters, often before the errno.
                message = (node.text or "").strip() or node.get("message") or ""
                # Of a chain of exceptions, the last one is what the test raised.
                message = message.split("During handling of the above exception, another exception occurred:")[-1]
                message = re.sub(r"^\S+\.py:\d+: ", "", message.strip())
                message = re.sub(r"^E\s+", "", message, flags=re.M)
                break
        results[case.get("name")] = (status, short(message))
    return results


def short(message):
    """The line that says what went wrong, without the run's temporary paths or tensorstore's spec dump, and
    with its end (where the errno is) kept when it is long."""
    lines = [l.strip() for l in message.splitlines() if l.strip()]
    line = next((l for l in lines if re.search(r"Errno|Error|exited|assert|Failed", l)), lines[0] if lines else "")
    line = re.sub(r"\s*\[tensorstore_spec=.*", "", line)
    # Each test's directory is <column dir>/fw-<run>/<test>/: only the part below it is worth reading.
    line = re.sub(r"/\S*?/fw-[0-9a-f]{8}/\w+/", "", line)
    line = re.sub(r"/tmp/expressfs-frameworks-\w+/\S*", "<dir>", line)
    if len(line) > 260:
        line = line[:90] + " ... " + line[-165:]
    return line


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--require", default="", help="comma-separated columns that must be all pass")
    ap.add_argument("--must-pass", default="", help="file of 'COLUMN TEST' lines that must pass (a regression guard)")
    ap.add_argument("columns", nargs="+", metavar="NAME=XML")
    args = ap.parse_args()

    columns = [c.split("=", 1) for c in args.columns]
    data = {name: load(path) for name, path in columns}
    names = []
    for results in data.values():
        for test in results or {}:
            if test not in names:
                names.append(test)

    def cell(col, test):
        results = data[col]
        if results is None:
            return "not run"
        return results.get(test, ("missing", ""))[0]

    header = ["test"] + [name for name, _ in columns]
    rows = [[t] + [cell(c, t) for c, _ in columns] for t in names]
    totals = ["passed"] + [f"{sum(cell(c, t) == 'pass' for t in names)}/{len(names)}" for c, _ in columns]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows + [totals]:
            print("| " + " | ".join(row) + " |")
    else:
        width = [max(len(r[i]) for r in [header] + rows + [totals]) for i in range(len(header))]
        for row in [header] + rows + [totals]:
            print("  ".join(v.ljust(w) for v, w in zip(row, width)))

    print()
    for col, _ in columns:
        for test in names:
            results = data[col] or {}
            status, message = results.get(test, ("", ""))
            if status in ("fail", "error"):
                print(f"{'- ' if args.markdown else ''}{col} / {test}: {message}")

    bad = [c for c in filter(None, args.require.split(",")) if any(cell(c, t) != "pass" for t in names) or not names]
    if bad:
        print(f"\nrequired columns not all green: {', '.join(bad)}")
        return 1
    if args.must_pass:
        with open(args.must_pass) as f:
            pairs = [l.split() for l in f if l.strip() and not l.lstrip().startswith("#")]
        regressed = [f"{c} / {t}" for c, t in pairs if c in data and cell(c, t) != "pass"]
        if regressed:
            print("\nexpected to pass, did not: " + "; ".join(regressed))
            return 1
        print(f"\nall {len(pairs)} tests expected to pass on the mounts passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
