"""libstdc++'s ``std::sort``, step for step, to predict llama.cpp's expert choice on ties.

llama.cpp's MoE router picks the top-k experts with ``ggml_argsort_top_k``: an argsort in
descending order, then the first k. Its CPU kernel (``ggml-cpu/ops.cpp``,
``ggml_compute_forward_argsort_f32``) fills ``0..n-1`` and calls ``std::sort`` with the comparator
``data[a] > data[b]``. ``std::sort`` is not stable: which of two experts with equal probabilities
comes first (and so which one is kept when they straddle the k-th place) depends on the algorithm.
GCC's libstdc++ (``bits/stl_algo.h``, ``bits/stl_heap.h``; unchanged for many releases) runs an
introsort: while a range is longer than 16, move the median of (second, middle, last) to the front,
Hoare-partition around it (unguarded, stopping on equal elements), recurse into the right part and
loop on the left; after ``2 * floor(log2 n)`` levels fall back to heap sort; finally one insertion
sort over the whole range (guarded for the first 16, unguarded after). For ``n <= 16`` only the
insertion sort runs, which is stable: ties keep the lower index first. Qwen3-Coder's 128 experts
take the introsort path, where they need not.

``std_sort(values)`` returns the permutation ``std::sort`` leaves in the index array;
``tests/test_parity_llamacpp.py`` checks it against llama.cpp's recorded choices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["THRESHOLD", "std_sort", "std_sort_indices"]

THRESHOLD = 16  # libstdc++ _S_threshold


def std_sort_indices(n: int, less: Callable[[int, int], bool]) -> list[int]:
    """``std::sort(a, a + n, less)`` on ``a = [0, 1, ..., n-1]`` (libstdc++'s algorithm); returns ``a``.

    ``less(x, y)`` is the comparator on elements (here indices), a strict weak ordering.
    """
    a = list(range(n))
    if n == 0:
        return a

    def unguarded_linear_insert(last: int) -> None:
        val = a[last]
        nxt = last - 1
        while less(val, a[nxt]):
            a[last] = a[nxt]
            last = nxt
            nxt -= 1
        a[last] = val

    def insertion_sort(first: int, last: int) -> None:
        if first == last:
            return
        for i in range(first + 1, last):
            if less(a[i], a[first]):
                val = a[i]
                a[first + 1:i + 1] = a[first:i]  # move_backward
                a[first] = val
            else:
                unguarded_linear_insert(i)

    def move_median_to_first(result: int, x: int, y: int, z: int) -> None:
        def swap(i: int, j: int) -> None:
            a[i], a[j] = a[j], a[i]
        if less(a[x], a[y]):
            if less(a[y], a[z]):
                swap(result, y)
            elif less(a[x], a[z]):
                swap(result, z)
            else:
                swap(result, x)
        elif less(a[x], a[z]):
            swap(result, x)
        elif less(a[y], a[z]):
            swap(result, z)
        else:
            swap(result, y)

    def unguarded_partition(first: int, last: int, pivot: int) -> int:
        while True:
            while less(a[first], a[pivot]):
                first += 1
            last -= 1
            while less(a[pivot], a[last]):
                last -= 1
            if not first < last:
                return first
            a[first], a[last] = a[last], a[first]
            first += 1

    def push_heap(first: int, hole: int, top: int, value: int) -> None:
        parent = (hole - 1) // 2
        while hole > top and less(a[first + parent], value):
            a[first + hole] = a[first + parent]
            hole = parent
            parent = (hole - 1) // 2
        a[first + hole] = value

    def adjust_heap(first: int, hole: int, length: int, value: int) -> None:
        top = hole
        child = hole
        while child < (length - 1) // 2:
            child = 2 * (child + 1)
            if less(a[first + child], a[first + child - 1]):
                child -= 1
            a[first + hole] = a[first + child]
            hole = child
        if length % 2 == 0 and child == (length - 2) // 2:
            child = 2 * (child + 1)
            a[first + hole] = a[first + child - 1]
            hole = child - 1
        push_heap(first, hole, top, value)

    def heap_sort(first: int, last: int) -> None:  # __partial_sort(first, last, last)
        length = last - first
        if length >= 2:  # __make_heap
            parent = (length - 2) // 2
            while True:
                adjust_heap(first, parent, length, a[first + parent])
                if parent == 0:
                    break
                parent -= 1
        while last - first > 1:  # __sort_heap: __pop_heap(first, last - 1, last - 1)
            last -= 1
            value = a[last]
            a[last] = a[first]
            adjust_heap(first, 0, last - first, value)

    def introsort_loop(first: int, last: int, depth: int) -> None:
        while last - first > THRESHOLD:
            if depth == 0:
                heap_sort(first, last)
                return
            depth -= 1
            mid = first + (last - first) // 2
            move_median_to_first(first, first + 1, mid, last - 1)
            cut = unguarded_partition(first + 1, last, first)
            introsort_loop(cut, last, depth)
            last = cut

    introsort_loop(0, n, 2 * (n.bit_length() - 1))
    if n > THRESHOLD:  # __final_insertion_sort
        insertion_sort(0, THRESHOLD)
        for i in range(THRESHOLD, n):
            unguarded_linear_insert(i)
    else:
        insertion_sort(0, n)
    return a


def std_sort(values: Sequence[float], descending: bool = True) -> list[int]:
    """The index permutation ggml's CPU argsort leaves for ``values`` (``GGML_SORT_ORDER_DESC``:
    comparator ``values[a] > values[b]``; ascending: ``<``). Float comparisons are Python's (IEEE
    doubles; float32 inputs compare exactly as in C)."""
    v = [float(x) for x in values]
    if descending:
        return std_sort_indices(len(v), lambda x, y: v[x] > v[y])
    return std_sort_indices(len(v), lambda x, y: v[x] < v[y])
