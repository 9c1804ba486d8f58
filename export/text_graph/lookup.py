"""Constant tables the text graph reads, each in a few gathers: per-code-point values in Unicode's
two-stage layout, and a trie as a double array (a transition is two gathers, whatever the trie's
size)."""

import numpy as np
import tensorflow as tf

# Code points a row of a second-stage table: blocks of code points with equal entries are stored once.
BLOCK = 256
CODE_POINTS = 0x110000


def two_stage(*columns):
    """(blocks, rows): arrays (CODE_POINTS, ...) in the two-stage layout, code point c's entry of
    column i at rows[i][blocks[c // BLOCK] * BLOCK + c % BLOCK]."""
    chunks = [column.reshape(CODE_POINTS // BLOCK, -1) for column in columns]
    seen, blocks, first = {}, [], []  # a block's bytes -> its row; each row's first block
    for i, key in enumerate(zip(*(map(bytes, chunk) for chunk in chunks))):
        if key not in seen:
            seen[key] = len(first)
            first.append(i)
        blocks.append(seen[key])
    rows = [
        chunk[first].reshape(len(first) * BLOCK, *column.shape[1:]) for chunk, column in zip(chunks, columns)
    ]
    return np.asarray(blocks, np.int32), rows


def look_up(chars, table):
    """The entries of code points chars (any shape, int32, in [0, CODE_POINTS)) in a two-stage table."""
    blocks, rows = table
    block = chars // BLOCK
    row = tf.gather(tf.constant(blocks), block) * BLOCK + (chars - block * BLOCK)
    return [tf.gather(tf.constant(column), row) for column in rows]


WINDOW = 1024  # bases tried at once when placing a node's children


def _first_fit(used, symbols, start):
    """The first base from `start` on at which every symbol's slot is free in `used` (which has
    WINDOW + the largest symbol slots more than any base it returns reaches)."""
    while True:
        bases = np.arange(start, start + WINDOW)
        taken = used[bases[:, None] + symbols[None, :]].any(axis=1)
        if not taken.all():
            return int(bases[np.argmin(taken)])
        start += WINDOW


class DoubleArray:
    """A trie of symbols 1..S as two arrays: node n's child on symbol c sits at slot base[n] + c,
    and is one if check[slot] == n (Aoe's double array). Nodes are their slots; the root is 0, and
    `dead` is a slot of no node, whose every step leads back to it.

    Built from `children`: {(parent, symbol): child} over nodes numbered from 0 (the root), and
    `values`: a value per node (`fill` for the dead slot and free ones)."""

    def __init__(self, children, values, fill=-1):
        by_parent = {}
        for (parent, symbol), child in children.items():
            by_parent.setdefault(parent, []).append((symbol, child))
        symbols_count = max((s for _, s in children), default=0) + 1
        size = 2 * (len(values) + symbols_count) + 2
        used, slot = np.zeros(size + WINDOW + symbols_count, bool), {0: 0}
        base, check = np.zeros(size, np.int64), np.full(size, -1, np.int64)
        used[0], free, queue = True, 1, [0]
        for node in queue:  # breadth first: a parent's slot is known before its children's
            edges = sorted(by_parent.get(node, []))
            if not edges:
                continue
            symbols = np.array([s for s, _ in edges])
            start = _first_fit(used, symbols, max(free - symbols[0], 1))
            base[slot[node]] = start
            for symbol, child in edges:
                slot[child] = start + symbol
                used[start + symbol], check[start + symbol] = True, slot[node]
                queue.append(child)
            while used[free]:
                free += 1
        # Past the last node: the dead slot, and room for any symbol after any base (no bound checks).
        self.dead = int(np.flatnonzero(used).max()) + 1
        end = self.dead + int(base.max()) + symbols_count
        base = np.resize(base, end)
        base[self.dead + 1 :] = 0
        base[self.dead] = self.dead + 1  # the dead slot's steps land past every node, where check is -1
        check = np.concatenate([check[: self.dead], np.full(end - self.dead, -1)])
        self.base, self.check = base.astype(np.int32), check.astype(np.int32)
        self.values = np.full(end, fill, np.int32)
        for node, at in slot.items():
            self.values[at] = values[node]

    def step(self, nodes, symbols):
        """nodes (slots; the dead one for none), symbols int32 in [0, S] (0: none of the trie's) ->
        the child of each node on its symbol, the dead slot where there is none."""
        at = tf.gather(tf.constant(self.base), nodes) + symbols
        return tf.where(tf.equal(tf.gather(tf.constant(self.check), at), nodes), at, self.dead)

    def value(self, nodes):
        """The value of each node (`fill` for the dead slot)."""
        return tf.gather(tf.constant(self.values), nodes)
