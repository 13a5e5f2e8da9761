#!/usr/bin/env python3
"""The markdown report of scripts/xfstests: xfstests' result.xml (xunit) of
each peer, side by side; the tests whose outcome differs; every failure with
the first lines of its output diff (or its message), and the not-run
reasons. Reads WORK/results/PEER/; writes to stdout."""

import argparse
import difflib
import os
import re
import xml.etree.ElementTree as ET

LABEL = {"ext4kit": "ext4kit (FUSE mount)", "kernel": "kernel ext4 (loop)"}


def load(res):
    """{test: (outcome, message)} from RES/result.xml; outcome is pass,
    fail or notrun."""
    out = {}
    tree = ET.parse(os.path.join(res, "result.xml"))
    for tc in tree.getroot().iter("testcase"):
        name = tc.get("name")
        fail = tc.find("failure")
        if fail is None:
            fail = tc.find("error")
        skip = tc.find("skipped")
        if fail is not None:
            out[name] = ("fail", (fail.get("message") or "").strip())
        elif skip is not None:
            out[name] = ("notrun", (skip.get("message") or "").strip())
        else:
            out[name] = ("pass", "")
    return out


def load_log(res):
    """The same from RES/check.log, for a run that was interrupted before
    xfstests wrote result.xml: a test line is "generic/NNN  <outcome>"."""
    out = {}
    last = None
    with open(os.path.join(res, "check.log"), errors="replace") as f:
        for line in f:
            m = re.match(r"^((?:generic|shared)/\d+)\s+(.*)$", line.rstrip())
            if not m:
                # "_check_...: inconsistent" and "(see ...)" continue a test.
                if last and "inconsistent" in line:
                    out[last] = ("fail", line.strip())
                continue
            name, rest = m.groups()
            last = name
            if rest.startswith("[not run]"):
                out[name] = ("notrun", rest[len("[not run]"):].strip())
            elif "[failed" in rest or "output mismatch" in rest or "[expunged]" in rest:
                out[name] = ("fail", rest.strip())
            elif re.search(r"\d+s\s*$", rest):
                out[name] = ("pass", "")
            # else: the test was running when the run stopped.
    return out


def diff_head(xt, res, test, n=8):
    """The first changed lines between the expected output and .out.bad."""
    exp = os.path.join(xt, "tests", test + ".out")
    bad = os.path.join(res, test + ".out.bad")
    if not (os.path.exists(exp) and os.path.exists(bad)):
        return []
    with open(exp, errors="replace") as f:
        a = f.read().splitlines()
    with open(bad, errors="replace") as f:
        b = f.read().splitlines()
    lines = [
        l
        for l in difflib.unified_diff(a, b, lineterm="", n=0)
        if not l.startswith(("---", "+++", "@@"))
    ]
    more = len(lines) - n
    lines = lines[:n]
    if more > 0:
        lines.append(f"... ({more} more changed lines)")
    return lines


def main():
    ap = argparse.ArgumentParser()
    for a in ("date", "kernel", "xfstests", "ext4kit-rev", "selection", "work", "peers"):
        ap.add_argument("--" + a, required=True)
    o = ap.parse_args()
    peers = [p for p in o.peers.split(",") if p]
    xt = os.path.join(o.work, "xfstests")
    data, secs, partial = {}, {}, []
    for p in peers:
        res = os.path.join(o.work, "results", p)
        # xfstests rewrites result.xml after every test and prints "Ran:"
        # when the run is over ("Interrupted!" too when it was stopped):
        # without the one or with the other, the run did not finish.
        try:
            with open(os.path.join(res, "check.log"), errors="replace") as f:
                log = f.read().splitlines()
            if not any(l.startswith("Ran:") for l in log) or "Interrupted!" in log:
                partial.append(p)
        except OSError:
            partial.append(p)
        try:
            data[p] = load(res)
        except (OSError, ET.ParseError):
            try:
                data[p] = load_log(res)
            except OSError as e:
                data[p] = {}
                print(f"<!-- {p}: no results ({e}) -->")
        try:
            with open(os.path.join(res, "seconds")) as f:
                secs[p] = int(f.read().strip())
        except (OSError, ValueError):
            secs[p] = None

    print(f"xfstests `{o.selection}` on {o.date}: ext4kit {o.ext4kit_rev}, "
          f"Linux {o.kernel}, xfstests {o.xfstests[:12]}.")
    for p in partial:
        done = sorted(data[p])
        upto = f", up to {done[-1]}" if done else ""
        print(f"**{LABEL.get(p, p)}: the run did not finish; "
              f"counted: the {len(done)} tests it completed{upto}.**")
    print()
    print("| | " + " | ".join(LABEL.get(p, p) for p in peers) + " |")
    print("|---|" + "---:|" * len(peers))
    for what, key in (("pass", "pass"), ("fail", "fail"), ("not run", "notrun")):
        cells = [str(sum(1 for v in data[p].values() if v[0] == key)) for p in peers]
        print(f"| {what} | " + " | ".join(cells) + " |")
    cells = [str(sum(1 for v in data[p].values() if v[0] != "notrun")) for p in peers]
    print("| ran (pass + fail) | " + " | ".join(cells) + " |")
    cells = [f"{secs[p] // 60} min {secs[p] % 60} s" if secs[p] is not None else "?" for p in peers]
    print("| time | " + " | ".join(cells) + " |")
    print()

    if len(peers) > 1:
        names = sorted(set.intersection(*(set(data[p]) for p in peers)))
        diff = [t for t in names if len({data[p][t][0] for p in peers}) > 1]
        print(f"Tests whose outcome differs ({len(diff)} of the {len(names)} every peer completed):")
        print()
        print("| test | " + " | ".join(peers) + " |")
        print("|---|" + "---|" * len(peers))
        for t in diff:
            print(f"| {t} | " + " | ".join(data[p].get(t, ("-", ""))[0] for p in peers) + " |")
        print()

    for p in peers:
        res = os.path.join(o.work, "results", p)
        fails = sorted(t for t, v in data[p].items() if v[0] == "fail")
        print(f"Failures on {LABEL.get(p, p)} ({len(fails)}):")
        print()
        for t in fails:
            print(f"- **{t}**: {data[p][t][1]}")
            d = diff_head(xt, res, t)
            if d:
                print("  ```")
                for l in d:
                    print("  " + l)
                print("  ```")
        print()

    for p in peers:
        nr = sorted(t for t, v in data[p].items() if v[0] == "notrun")
        print(f"<details><summary>Not run on {LABEL.get(p, p)} ({len(nr)})</summary>")
        print()
        for t in nr:
            print(f"- {t}: {data[p][t][1]}")
        print()
        print("</details>")
        print()


if __name__ == "__main__":
    main()
