#!/usr/bin/env python3
"""check-layers.py - fails when two modules of the collector import each other.

Reads every `crate::...` and `super::...` path of server/src (test modules excluded), maps
each to the file module that defines it, and reports every strongly connected group of
modules (an import cycle). ARCHITECTURE.md ("Code map") says why the layers point one way.
    scripts/check-layers.py [server/src]
"""
import re, os, sys
root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', 'server', 'src')
mods = {}
for dp, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith('.rs'): continue
        p = os.path.join(dp, f)
        rel = os.path.relpath(p, root)[:-3].replace(os.sep, '::')
        rel = re.sub(r'(::)?mod$', '', rel)
        if rel in ('lib', 'main'): rel = 'crate' if rel == 'lib' else 'main'
        mods[rel] = p
def resolve(path):
    parts = path.split('::')
    for n in range(len(parts), 0, -1):
        cand = '::'.join(parts[:n])
        if cand in mods: return cand
    return None
edges = {}
for m, p in mods.items():
    src = open(p).read()
    i = src.find('#[cfg(test)]\nmod tests')
    if i >= 0: src = src[:i]
    src = '\n'.join(l for l in src.split('\n') if not l.strip().startswith('//'))
    deps = set()
    for x in re.findall(r'crate::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)', src):
        t = resolve(x)
        if t and t != m: deps.add(t)
    parent = m.rsplit('::', 1)[0] if '::' in m else None
    for x in re.findall(r'\bsuper::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)', src):
        base = parent if parent else ''
        t = resolve((base + '::' + x) if base else x)
        if t and t != m: deps.add(t)
    edges[m] = deps
# parent/child: a child using its parent's items is fine as long as the parent does not use the child
cycles = []
for a in edges:
    for b in edges[a]:
        if a in edges.get(b, ()) and a < b:
            cycles.append((a, b))
# longer cycles via DFS (SCCs)
idx = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(sorted(comp))
for v in list(edges):
    if v not in idx: sc(v)
for s in sccs: print('cycle:', ' <-> '.join(s))
print(f'check-layers: {len(sccs)} import cycles among {len(mods)} modules')
sys.exit(1 if sccs else 0)
