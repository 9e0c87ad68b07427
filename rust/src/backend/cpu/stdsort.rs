//! libstdc++'s `std::sort` (introsort: median-of-three quicksort down to 16 elements, heapsort past
//! `2·⌊log₂ n⌋` levels, then one insertion sort), step for step, so that fak orders equal keys as
//! llama.cpp's CPU build does. ggml's `argsort` (and through it `argsort_top_k`, the MoE router's
//! expert choice) is `std::sort` over indices with a strict comparator, which is not stable: which
//! of two experts with the same probability is chosen depends on this exact sequence of compares
//! and swaps (GCC 12's `bits/stl_algo.h` and `bits/stl_heap.h`; the algorithm has not changed
//! since GCC 4.x).

/// Sorts `v` by the strict weak order `less` exactly as libstdc++'s `std::sort(v.begin(),
/// v.end(), less)` does, including the order it leaves equal elements in.
pub fn std_sort<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    let n = v.len();
    if n < 2 {
        return;
    }
    let depth = 2 * (usize::BITS - 1 - n.leading_zeros()) as usize;
    introsort_loop(v, 0, n, depth, less);
    final_insertion_sort(v, 0, n, less);
}

const THRESHOLD: usize = 16;

fn introsort_loop<T: Copy>(v: &mut [T], first: usize, mut last: usize, mut depth: usize, less: &impl Fn(&T, &T) -> bool) {
    while last - first > THRESHOLD {
        if depth == 0 {
            heap_sort(&mut v[first..last], less);
            return;
        }
        depth -= 1;
        let cut = partition_pivot(v, first, last, less);
        introsort_loop(v, cut, last, depth, less);
        last = cut;
    }
}

/// `__unguarded_partition_pivot`: the median of `first + 1`, the middle and `last − 1` moved to
/// `first`, then Hoare's unguarded partition of `first + 1 .. last` around it.
fn partition_pivot<T: Copy>(v: &mut [T], first: usize, last: usize, less: &impl Fn(&T, &T) -> bool) -> usize {
    let mid = first + (last - first) / 2;
    move_median_to_first(v, first, first + 1, mid, last - 1, less);
    let (mut lo, mut hi) = (first + 1, last);
    loop {
        while less(&v[lo], &v[first]) {
            lo += 1;
        }
        hi -= 1;
        while less(&v[first], &v[hi]) {
            hi -= 1;
        }
        if lo >= hi {
            return lo;
        }
        v.swap(lo, hi);
        lo += 1;
    }
}

fn move_median_to_first<T: Copy>(v: &mut [T], result: usize, a: usize, b: usize, c: usize, less: &impl Fn(&T, &T) -> bool) {
    let pick = if less(&v[a], &v[b]) {
        if less(&v[b], &v[c]) {
            b
        } else if less(&v[a], &v[c]) {
            c
        } else {
            a
        }
    } else if less(&v[a], &v[c]) {
        a
    } else if less(&v[b], &v[c]) {
        c
    } else {
        b
    };
    v.swap(result, pick);
}

fn final_insertion_sort<T: Copy>(v: &mut [T], first: usize, last: usize, less: &impl Fn(&T, &T) -> bool) {
    if last - first > THRESHOLD {
        insertion_sort(v, first, first + THRESHOLD, less);
        for i in first + THRESHOLD..last {
            unguarded_linear_insert(v, i, less);
        }
    } else {
        insertion_sort(v, first, last, less);
    }
}

fn insertion_sort<T: Copy>(v: &mut [T], first: usize, last: usize, less: &impl Fn(&T, &T) -> bool) {
    for i in first + 1..last {
        if less(&v[i], &v[first]) {
            let val = v[i];
            v.copy_within(first..i, first + 1);
            v[first] = val;
        } else {
            unguarded_linear_insert(v, i, less);
        }
    }
}

fn unguarded_linear_insert<T: Copy>(v: &mut [T], mut last: usize, less: &impl Fn(&T, &T) -> bool) {
    let val = v[last];
    let mut next = last - 1;
    while less(&val, &v[next]) {
        v[last] = v[next];
        last = next;
        next -= 1;
    }
    v[last] = val;
}

/// `__partial_sort(first, last, last)`: `__make_heap` then `__sort_heap`.
fn heap_sort<T: Copy>(v: &mut [T], less: &impl Fn(&T, &T) -> bool) {
    let len = v.len();
    if len >= 2 {
        let mut parent = (len - 2) / 2;
        loop {
            let value = v[parent];
            adjust_heap(v, parent, len, value, less);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    let mut last = len;
    while last > 1 {
        last -= 1;
        // __pop_heap(first, last, last)
        let value = v[last];
        v[last] = v[0];
        adjust_heap(v, 0, last, value, less);
    }
}

fn adjust_heap<T: Copy>(v: &mut [T], mut hole: usize, len: usize, value: T, less: &impl Fn(&T, &T) -> bool) {
    let top = hole;
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if less(&v[child], &v[child - 1]) {
            child -= 1;
        }
        v[hole] = v[child];
        hole = child;
    }
    if len & 1 == 0 && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        v[hole] = v[child - 1];
        hole = child - 1;
    }
    // __push_heap(first, hole, top, value)
    let mut parent = hole.wrapping_sub(1) / 2;
    while hole > top && less(&v[parent], &value) {
        v[hole] = v[parent];
        hole = parent;
        parent = hole.wrapping_sub(1) / 2;
    }
    v[hole] = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *seed >> 33
    }

    #[test]
    fn sorts_like_a_sort() {
        let mut seed = 7;
        for n in [0usize, 1, 2, 3, 15, 16, 17, 33, 128, 129, 512, 1000] {
            for range in [2u64, 5, 1000] {
                let mut v: Vec<u64> = (0..n).map(|_| lcg(&mut seed) % range).collect();
                let mut want = v.clone();
                want.sort();
                std_sort(&mut v, &|a, b| a < b);
                assert_eq!(v, want, "n {n} range {range}");
            }
        }
    }

    #[test]
    fn heap_path_sorts() {
        let mut seed = 3;
        for n in [2usize, 3, 4, 5, 16, 17, 100] {
            let mut v: Vec<u64> = (0..n).map(|_| lcg(&mut seed) % 7).collect();
            let mut want = v.clone();
            want.sort();
            heap_sort(&mut v, &|a, b| a < b);
            assert_eq!(v, want);
        }
    }

    /// Argsort of keys with ties: the permutation is a valid descending order, and it is not
    /// always the stable one (ties among > 16 keys come out in libstdc++'s order; the parity
    /// goldens pin that order against llama.cpp itself).
    #[test]
    fn argsort_with_ties_is_descending() {
        let keys: Vec<f32> = (0..128).map(|i| ((i * 37) % 5) as f32).collect();
        let mut idx: Vec<i32> = (0..128).collect();
        std_sort(&mut idx, &|&a, &b| keys[a as usize] > keys[b as usize]);
        for w in idx.windows(2) {
            assert!(keys[w[0] as usize] >= keys[w[1] as usize]);
        }
        let mut stable: Vec<i32> = (0..128).collect();
        stable.sort_by(|&a, &b| keys[b as usize].partial_cmp(&keys[a as usize]).unwrap());
        assert_ne!(idx, stable, "introsort is not stable on these ties");
    }
}
