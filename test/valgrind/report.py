#!/usr/bin/env python3
"""Summarise memcheck logs written by test/valgrind/run.

Every error or definite leak whose stack passes through outbox_pg is
printed in full and makes the exit status 1.  Reports from elsewhere
(PostgreSQL, libcurl, OpenSSL, glibc) are counted and listed by their
first frames, for the suppressions file (test/valgrind.supp) to decide.
"""
import collections
import os
import re
import sys

logdir = sys.argv[1]
# our frames: the library's name, or (with debug info and --fullpath-after=)
# one of our source files
ours_re = re.compile(r"outbox_pg|\bsrc/(%s)\.c:\d+" % "|".join(
    re.escape(f[:-2]) for f in os.listdir(sys.argv[2]) if f.endswith(".c")))
ours = []
others = collections.Counter()
processes = 0
for name in sorted(os.listdir(logdir)):
    processes += 1
    block = []
    with open(os.path.join(logdir, name), errors="replace") as f:
        lines = f.read().splitlines()
    blocks = []
    for line in lines:
        m = re.match(r"^==\d+== ?(.*)$", line)
        if not m:
            continue            # generated suppressions and the like
        text = m.group(1)
        if text == "":
            if block:
                blocks.append(block)
            block = []
        else:
            block.append(text)
    if block:
        blocks.append(block)
    for b in blocks:
        head = b[0]
        if not re.match(r"(Invalid|Conditional|Use of uninit|Syscall param|Mismatched|Source and destination|Argument|.*definitely lost|Invalid free)", head):
            continue
        if any(ours_re.search(l) for l in b):
            ours.append((name, b))
        else:
            frames = [re.sub(r"^(at|by) 0x[0-9A-F]+: ", "", l.strip()) for l in b[1:4]]
            others[re.sub(r"\d+", "N", head) + " | " + " < ".join(frames)] += 1

print("%d server processes checked" % processes)
print("%d reports through outbox_pg" % len(ours))
for name, b in ours:
    print("--- %s" % name)
    print("\n".join(b))
print("%d reports elsewhere (not ours; suppress in test/valgrind.supp if benign):" % sum(others.values()))
for k, n in others.most_common():
    print("  %4d  %s" % (n, k))
sys.exit(1 if ours else 0)
