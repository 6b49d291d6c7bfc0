"""Reading the user docs as the docs test does: which files, their text with the regions
marked as not checked blanked (line numbers kept), shell line continuations joined, and the
file:line of an offset."""

import glob
import os
import re

RUN_MARK = "<!-- docs-test: runs -->"
SKIP_MARK = "<!-- docs-test: not checked -->"
CHECK_MARK = "<!-- docs-test: checked -->"


def user_docs(source):
    return [os.path.join(source, "README.md")] + sorted(glob.glob(os.path.join(source, "docs",
                                                                             "*.md")))


def read_doc(path):
    """The file's text with each region between SKIP_MARK and CHECK_MARK blanked (its lines
    kept, for line numbers): docs/testing.md quotes this test's failures there."""
    text = open(path).read()
    return re.sub(re.escape(SKIP_MARK) + ".*?" + re.escape(CHECK_MARK),
                  lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.DOTALL)


def rel(source, path):
    return os.path.relpath(path, source)


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def join_continuations(raw):
    """The text with shell line continuations (backslash, newline, indent) made one space, and
    for each of its characters the offset in `raw` it came from (for line numbers)."""
    text, where, i = [], [], 0
    for m in re.finditer(r"\\\n\s*", raw):
        text.append(raw[i:m.start()])
        where.extend(range(i, m.start()))
        text.append(" ")
        where.append(m.start())
        i = m.end()
    text.append(raw[i:])
    where.extend(range(i, len(raw) + 1))
    return "".join(text), where


def iter_lines(text):
    start = 0
    for line in text.split("\n"):
        yield start, line
        start += len(line) + 1
