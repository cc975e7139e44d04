"""Host microseconds per source line of a library function on the request path: the function's
statements (inside with-blocks too) are rewritten to add their own duration to a per-line
total, then a request or a prepared plan's run is repeated and the lines printed, costliest
first. Unlike cProfile this times inline code (argument tuples, context managers, attribute
reads), which is what is left of a request's host time.

    python3 benchmarks/line_times.py [--shape wan-1.3b-480p] [--what run|request] [--n 300]
        [--function tessera.api._launch_here]
"""

import argparse
import ast
import importlib
import inspect
import sys
import textwrap
import time
from collections import defaultdict

import tessera

from request_hotspots import random_request  # this folder's: run as a script

_totals: dict = defaultdict(float)
_counts: dict = defaultdict(int)


class _Timed(ast.NodeTransformer):
    """Wraps each statement of a body in ``t = perf_counter(); <stmt>; _add(line, t)``, except
    control flow that leaves the block (return, raise, ...), whose time goes uncounted."""

    def _wrap(self, body):
        out = []
        for stmt in body:
            self.generic_visit(stmt)
            if isinstance(stmt, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
                out.append(stmt)
                continue
            start = ast.parse(f"_lt_t{stmt.lineno} = _lt_clock()").body[0]
            stop = ast.parse(f"_lt_add({stmt.lineno}, _lt_t{stmt.lineno})").body[0]
            out += [start, stmt, stop]
        return out

    def generic_visit(self, node):
        for field in ("body", "orelse", "finalbody"):
            if isinstance(getattr(node, field, None), list) and not isinstance(node, ast.Module):
                setattr(node, field, self._wrap(getattr(node, field)))
        return node


def _add(line: int, t0: float) -> None:
    _totals[line] += time.perf_counter() - t0
    _counts[line] += 1


def instrument(qualname: str):
    """Replace the function ``qualname`` (``module.function`` or ``module.Class.method``) by its
    instrumented copy; returns (its source lines, first line number)."""
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest importable module prefix
        try:
            mod = importlib.import_module(".".join(parts[:cut]))
            break
        except ImportError:
            continue
    owner = mod
    for name in parts[cut:-1]:
        owner = getattr(owner, name)
    fn_name = parts[-1]
    raw = vars(owner)[fn_name]
    fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
    src_lines, first = inspect.getsourcelines(fn)
    tree = ast.parse(textwrap.dedent("".join(src_lines)))
    ast.increment_lineno(tree, first - 1)
    func = tree.body[0]
    func.decorator_list = []
    func.body = _Timed()._wrap(func.body)
    ns = dict(vars(mod), _lt_clock=time.perf_counter, _lt_add=_add)
    exec(compile(ast.fix_missing_locations(tree), inspect.getsourcefile(fn), "exec"), ns)
    new = ns[fn_name]
    setattr(owner, fn_name, type(raw)(new) if isinstance(raw, (classmethod, staticmethod))
            else new)
    return src_lines, first


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="wan-1.3b-480p")
    ap.add_argument("--density", type=float, default=0.1)
    ap.add_argument("--what", choices=("run", "request"), default="run")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--function", default="tessera.api._launch_here")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    h, d, (q, k, v), new_mask = random_request(args.shape, args.density)
    p = tessera.plan(new_mask(), num_q_heads=h, head_dim=d)
    call = {"run": lambda: p.run(q, k, v),
            "request": lambda: tessera.attention(q, k, v, new_mask())}[args.what]
    for _ in range(5):
        call()
    src, first = instrument(args.function)
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    _totals.clear()
    _counts.clear()
    whole = []
    for _ in range(args.n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        whole.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    whole.sort()
    print(f"{args.function} under {args.what} ({args.shape}), {args.n} calls; whole call median "
          f"{whole[len(whole) // 2] * 1e6:.1f} us; per line (with what it nests), mean us a "
          f"call:")
    for line in sorted(_totals, key=lambda n: -_totals[n])[:args.top]:
        text = src[line - first].strip() if 0 <= line - first < len(src) else "?"
        print(f"{_totals[line] / args.n * 1e6:8.1f}  {line:5}  {text[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
