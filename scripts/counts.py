#!/usr/bin/env python3
"""The house's counts (docs/architecture.md, "Counts"): JSON key literals outside the model's
declarations, the largest classes (data members, lines), the longest functions, and the size of
each interface of the device seam. Heuristic (it reads text, not an AST), so read a surprising
figure in the file it names. Usage: scripts/counts.py [--top N]"""
import argparse
import collections
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
KEY = re.compile(r'''(?:\[\s*"([a-z_][a-z0-9_.]*)"\s*\]|\.(?:at|value|contains|find|count|erase)\(\s*"([a-z_][a-z0-9_.]*)"'''
                 r'''|\{\s*"([a-z_][a-z0-9_]*)"\s*,)''')
CLASS = re.compile(r'^(\s*)(?:class|struct)\s+(\w+)[^;(]*\{\s*$')
FUNC = re.compile(r'^(\s*)[^\s/#].*\)\s*(?:const\s*)?(?:noexcept\s*)?(?:override\s*)?(?:->\s*[\w:<>]+\s*)?\{\s*$')


def sources(*tops):
    for top in tops:
        for p in sorted((ROOT / top).rglob('*')):
            if p.suffix in ('.h', '.cpp'):
                yield p


def rel(p):
    return str(p.relative_to(ROOT))


# Matches of KEY that are not JSON keys, left out of the count (docs/architecture.md, "Counts"):
# comments; a CLI option's choices (IsMember); a printed table's row labels (Table::add); the words
# a message offers (did_you_mean, bad_choice); the values a field may take (a flat array of words,
# `kWords[] = {"true", ...}`, and custody's OneOf rule); the words of an option's name that
# completion looks for (has_any); Prometheus metric names (cupool_*); and tables that map a name
# to code (an enumerator or a member function: {"hello", &Holder::op_hello}); a table of terminal
# colours ({"error", "\033[1;31m"}); and a search in a message's text (message.find("subcommand")).
NOT_KEY_CONTEXT = re.compile(r'IsMember\(\{|\.add\(\{|did_you_mean\(|bad_choice\(|has_any\(|OneOf\{|\w\[\]\s*=\s*\{\s*"'
                             r'|\bmessage\.find\(')
NOT_KEY_MATCH = re.compile(r'\{\s*"cupool_[a-z0-9_]*"\s*,|\{\s*"[A-Za-z_][A-Za-z0-9_]*"\s*,\s*(?:&|[A-Z]\w*::)'
                           r'|\{\s*"\w+"\s*,\s*"\\033')

# The declarations: the model's (core/model/), the protocol's messages, and the config file's YAML
# keys (core/config/keys.h: each mapping's keys, declared once, held against the config schema by
# tests/unit/config/keys_test.cpp).
DECLARATIONS = ('core/model/', 'core/protocol/messages', 'core/config/keys.h')


def keys_in(line, counted=True):
    """The JSON key literals in one line of code (counted=False: the matches left out)."""
    line = re.sub(r'^\s*//.*$|\s//.*$', '', line)
    n = m_out = 0
    for m in KEY.finditer(line):
        if NOT_KEY_CONTEXT.search(line, 0, m.end()) or NOT_KEY_MATCH.match(line, m.start()):
            m_out += 1
        else:
            n += 1
    return n if counted else m_out


def key_literals():
    files = collections.Counter()
    for p in sources('core', 'cli'):
        r = rel(p)
        if r.startswith(DECLARATIONS):
            continue
        for line in p.read_text().splitlines():
            files[r] += keys_in(line)
    return files


def block_end(lines, i, indent):
    """The line closing the block opened on line i (a '}' at the same indentation)."""
    for j in range(i + 1, len(lines)):
        s = lines[j]
        if s.startswith(indent + '}') and not s.startswith(indent + ' '):
            return j
    return len(lines) - 1


def classes():
    out = []
    for p in sources('core'):
        lines = p.read_text().splitlines()
        for i, line in enumerate(lines):
            m = CLASS.match(line)
            if not m:
                continue
            indent = m.group(1)
            end = block_end(lines, i, indent)
            member = indent + '  '
            data = 0
            depth = 0
            for s in lines[i + 1:end]:
                body = s.strip()
                if s.startswith(member) and not s.startswith(member + ' ') and depth == 0:
                    if (body.endswith(';') and '(' not in body.split('=')[0] and not body.startswith(
                            ('using ', 'friend ', 'static constexpr', 'static const', 'return', '//', 'enum', 'typedef'))
                            and 'operator' not in body):
                        data += 1
                depth += s.count('{') - s.count('}')
            out.append((data, end - i + 1, m.group(2), rel(p), i + 1))
    return out


def code(line):
    """The line without its trailing comment and spaces."""
    return re.sub(r'\s*//.*$', '', line).rstrip()


def functions():
    out = []
    for p in sources('core', 'cli'):
        lines = p.read_text().splitlines()
        for i, line in enumerate(lines):
            if not FUNC.match(line):
                continue
            # A signature may take several lines: its first line has the indentation.
            start = i
            while start > 0 and code(lines[start - 1]) and not code(lines[start - 1]).endswith(
                    (';', '{', '}', ':')) and not lines[start - 1].lstrip().startswith('#'):
                start -= 1
            first = lines[start]
            if re.match(r'\s*(if|for|while|switch|catch|else|do|namespace|class|struct|return)\b', first):
                continue
            if first.strip().startswith(('{', '}', '&', '|', '?', ':', '<<')) or '=' in first.split('(')[0] or '[' in first.split('(')[0]:
                continue
            indent = re.match(r'\s*', first).group(0)
            end = block_end(lines, i, indent)
            name = re.findall(r'([~\w:]+)\s*\(', first)
            out.append((end - start + 1, name[0] if name else '?', rel(p), start + 1))
    return out


def interfaces():
    text = (ROOT / 'core/device/backend.h').read_text()
    out = []
    for m in re.finditer(r'^class (\w+)[^{;]*\{(.*?)^\};', text, re.S | re.M):
        n = len(re.findall(r'virtual [^~][^;]*= 0;', m.group(2)))
        out.append((n, m.group(1)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--top', type=int, default=8)
    ap.add_argument('--keys', action='store_true', help='list the lines with JSON key literals counted, by file and line')
    ap.add_argument('--not-keys', action='store_true', help='list the lines with matches left out as not JSON keys')
    a = ap.parse_args()
    if a.keys or a.not_keys:
        for p in sources('core', 'cli'):
            r = rel(p)
            if r.startswith(DECLARATIONS):
                continue
            for i, line in enumerate(p.read_text().splitlines(), 1):
                if keys_in(line, counted=a.keys):
                    print(f'{r}:{i}: {line.strip()}')
        return 0
    keys = key_literals()
    print(f'JSON key literals outside the declarations ({", ".join(DECLARATIONS)}): {sum(keys.values())}')
    for f, c in keys.most_common(a.top):
        if c:
            print(f'  {c:4} {f}')
    cs = classes()
    # A class's lines are its declaration and its members defined out of line.
    out_of_line = collections.Counter()
    for n, name, f, line in functions():
        if '::' in name:
            out_of_line[name.split('::')[-2]] += n
    cs = [(d, n + out_of_line[name], name, f, line) for d, n, name, f, line in cs]
    print('classes in core/ by data members (members, lines with out-of-line members, class, where):')
    for d, n, name, f, line in sorted(cs, reverse=True)[:a.top]:
        print(f'  {d:4} {n:5}  {name}  {f}:{line}')
    print('classes in core/ by lines:')
    for d, n, name, f, line in sorted(cs, key=lambda c: -c[1])[:a.top]:
        print(f'  {d:4} {n:5}  {name}  {f}:{line}')
    fs = sorted(functions(), reverse=True)
    print(f'functions in core/ and cli/ over 80 lines: {sum(1 for f in fs if f[0] > 80)}')
    for n, name, f, line in fs[:a.top]:
        print(f'  {n:4}  {name}  {f}:{line}')
    print('the device seam (core/device/backend.h), pure virtual functions per interface:')
    for n, name in interfaces():
        print(f'  {n:4}  {name}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
