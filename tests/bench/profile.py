#!/usr/bin/env python3
"""drc's cost of one operation by function and by part, from a callgrind profile of bench_misses.

Usage: profile.py CALLGRIND_OUT OPS SRC_ROOT
The profile is collected inside one operation only (valgrind --toggle-collect=op_free, ...) with
--compress-strings=no --compress-pos=no --cache-sim=yes; OPS is how many ran. Each cost line is
given to the source function whose body holds its line (so code the compiler inlined is counted
where it is written, not where it landed), functions without source (libc) by their symbol, and
each function to one of the parts of an invalidation. Prints per operation: instructions, L1 data
misses (D1mr+D1mw) and last-level data misses (DLmr+DLmw), by function, then by part.
"""
import collections
import os
import re
import sys

PARTS = [
    ("index: remove and rebalance", {"drc__itree_remove", "drc__itree_remove_at", "bt_remove_path", "bt_rm",
                                     "bt_cut", "bt_fix", "bt_set", "bt_copy", "bt_setn", "bt_max_last",
                                     "bt_refresh", "bt_spare_push", "bt_last_entry", "bt_w_begin", "bt_w_end"}),
    ("index: search (descents, leaves, paths)", {"drc__itree_first", "drc__itree_first_at", "drc__itree_next",
                                                 "drc__itree_floor", "drc__itree_at", "bt_first_disjoint",
                                                 "bt_seek", "bt_upper", "bt_lower", "bt_walk_root", "bt_moved",
                                                 "bt_count_of", "bt_next_leaf", "bt_gave_up"}),
    ("index: insert", {"drc__itree_insert", "drc__itree_insert_at", "bt_ins", "bt_put", "bt_grow",
                       "bt_node_new"}),
    ("hint table and used-grain filter", {"hint_slot", "hint_new", "hint_want", "hint_grow", "used_set", "used_none"}),
    ("lockless pre-checks (hull, nothing_there)", {"nothing_there", "closed_range", "nothing_registered"}),
    ("thread slots: drain, tallies", {"drain_begin", "drain_end", "drain_slot", "drain_locked", "slot_refs",
                                      "slot_holds", "slot_put", "join_refs", "tally", "tally_sum", "count_hit",
                                      "drc__tslot", "drc__tslot_claim", "off_held", "ref_bit",
                                      "joined_next"}),
    ("LRU, pool, release to pool", {"lru_unlink", "lru_append", "pool_get", "release_list", "chunk_new",
                                    "chunk_drop", "try_release", "try_release_w"}),
    ("lock and sequence count", {"lock", "unlock", "unlock_once", "locked", "seq_begin", "seq_end",
                                 "lock_looks_free", "lock_contended", "invq_run", "queue_invalidation",
                                 "pthread_mutex_trylock", "pthread_mutex_unlock", "pthread_mutex_lock",
                                 "__pthread_mutex_trylock", "__pthread_mutex_unlock", "__pthread_mutex_lock",
                                 "__pthread_mutex_unlock_usercnt", "___pthread_mutex_trylock",
                                 "___pthread_mutex_unlock", "___pthread_mutex_lock", "wait_pending"}),
    ("invalidation body (retire, unlink, counters)", {"retire_at", "drc__cache_invalidate", "drc_invalidate", "invalidate_locked",
                                                      "retire", "unlink_live", "revoke_take", "revoke_list",
                                                      "region_of", "region_len", "drc_region_invalidate", "is_live",
                                                      "held"}),
    ("notify: every cache, dmabuf exports", {"drc_notify_free", "drc__mem_released", "drc__notify_active",
                                             "cuda_released", "drc__cuda_exports_busy"}),
    ("backend dereg (no work)", {"be_dereg", "drc_dereg", "be_reg", "drc_reg"}),
    ("get and put", {"drc_get", "drc_put", "lookup_lockless", "tryget", "tryget_fast", "tryget_slot", "put_ref",
                     "put_released", "put_other", "put_slot", "released_detached", "became_idle", "covers",
                     "handed_over", "serves", "find_containing", "stale_hit", "get_slow", "plan_region",
                     "register_plan", "publish", "pending_overlaps", "pending_unlink", "joinable", "supersede",
                     "widen_hull", "drc__notify_wait_frees", "drc__notify_freeing", "freeing_overlaps",
                     "drc__mem_classify", "mem_alloc", "mem_free"}),
]
PART_OF = {f: p for p, fs in PARTS for f in fs}

FUNC_START = re.compile(r"^(?!typedef|struct \w+ \{|enum \{|#)[A-Za-z_][\w \*\(\)]*?\b(\w+)\(")


def functions_of(path, cache={}):
    """[(first line, last line, name)] of the C functions defined in @path (at column 0, body to a '}' there)."""
    if path in cache:
        return cache[path]
    spans, name, start = [], None, 0
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    except OSError:
        lines = []
    for i, text in enumerate(lines, 1):
        if name is None:
            m = FUNC_START.match(re.sub(r"__attribute__\(\([^)]*\)\)\s*", "", text))
            if m and m.group(1) not in ("defined", "offsetof", "_Static_assert"):
                j = i - 1       # a prototype's signature ends in ';' before any '{'
                while j < len(lines) and "{" not in lines[j] and not lines[j].rstrip().endswith(";"):
                    j += 1
                if j < len(lines) and "{" in lines[j]:
                    name, start = m.group(1), i
        elif text.startswith("}"):
            spans.append((start, i, name))
            name = None
    cache[path] = spans
    return spans


def owner(path, line, fn, root):
    if path and path != "???":
        full = path if os.path.isabs(path) else os.path.join(root, path)
        for a, b, name in functions_of(full):
            if a <= line <= b:
                return name
    return re.sub(r"('\d+|@.*)$", "", fn or "?")     # callgrind's recursion suffix, a symbol's version


def main():
    out, ops, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    events, cost = None, collections.defaultdict(lambda: [0, 0, 0])
    fl = fi = fn = None
    skip = False
    for raw in open(out, encoding="utf-8", errors="replace"):
        line = raw.rstrip("\n")
        if line.startswith("events:"):
            events = line.split()[1:]
            continue
        if line.startswith("fl="):
            fl = fi = line[3:]
        elif line.startswith(("fi=", "fe=")):
            fi = line[3:]
        elif line.startswith("fn="):
            fn, fi = line[3:], fl
        elif line.startswith("calls="):
            skip = True
        elif line[:1].isdigit() and events:
            if skip:                    # the inclusive cost of a call: counted in the callee
                skip = False
                continue
            f = line.split()
            v = dict(zip(events, [int(x) for x in f[1:]] + [0] * len(events)))
            c = cost[owner(fi, int(f[0]), fn, root)]
            c[0] += v.get("Ir", 0)
            c[1] += v.get("D1mr", 0) + v.get("D1mw", 0)
            c[2] += v.get("DLmr", 0) + v.get("DLmw", 0)
    total = [sum(c[k] for c in cost.values()) for k in range(3)]
    print("%-44s %10s %8s %8s" % ("function (per operation)", "instr", "L1 miss", "LL miss"))
    for name, c in sorted(cost.items(), key=lambda kv: -kv[1][0]):
        if c[0] / ops >= 1 or c[2] / ops >= 0.05:
            print("%-44s %10.1f %8.2f %8.2f" % (name, c[0] / ops, c[1] / ops, c[2] / ops))
    parts = collections.defaultdict(lambda: [0, 0, 0])
    for name, c in cost.items():
        p = PART_OF.get(name, "harness and other" if name.startswith(("op_", "free_event", "get", "put", "must", "cache_"))
                        else "other: " + name)
        for k in range(3):
            parts[p][k] += c[k]
    print()
    print("%-44s %10s %8s %8s %6s" % ("part (per operation)", "instr", "L1 miss", "LL miss", "instr%"))
    for p, c in sorted(parts.items(), key=lambda kv: -kv[1][0]):
        print("%-44s %10.1f %8.2f %8.2f %5.1f%%" % (p, c[0] / ops, c[1] / ops, c[2] / ops, 100.0 * c[0] / max(total[0], 1)))
    print("%-44s %10.1f %8.2f %8.2f" % ("total", total[0] / ops, total[1] / ops, total[2] / ops))


main()
