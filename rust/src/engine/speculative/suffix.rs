//! Suffix-index drafts (after SuffixDecoding, Oliaro et al. 2024, arXiv:2411.04975): the longest
//! suffix of the sequence, of any length, that occurred earlier in it proposes the tokens that
//! followed its latest earlier occurrence, as many as the match is long (up to `k`): a long match
//! (a file re-emitted, a diff, a log line) drafts far, a one-token match drafts one token.
//!
//! The index is a suffix automaton (Blumer et al. 1985; the online construction of Crochemore and
//! Hancart), built as tokens are appended in amortized O(1) per token and O(n) states. After
//! appending a token, the state linked from the whole text's state is the longest suffix that also
//! ends earlier; each state keeps the latest end position of its strings (updated along the
//! suffix-link path of each new token, the first [`LAST_WALK`] states: the long suffixes, which
//! are the ones matched; shorter ones may keep an earlier, still valid, occurrence).

use std::collections::HashMap;

use super::copy_continuation;

const NONE: u32 = u32::MAX;
/// States of a new token's suffix-link path whose latest end is updated.
const LAST_WALK: usize = 48;
/// Out-edges kept in a list below this many, in a hash map from it.
const FEW_EDGES: usize = 12;

#[derive(Debug, Clone)]
enum Edges {
    Few(Vec<(u32, u32)>),
    Many(HashMap<u32, u32>),
}

impl Edges {
    fn get(&self, t: u32) -> Option<u32> {
        match self {
            Edges::Few(v) => v.iter().find(|e| e.0 == t).map(|e| e.1),
            Edges::Many(m) => m.get(&t).copied(),
        }
    }

    fn set(&mut self, t: u32, to: u32) {
        match self {
            Edges::Few(v) => {
                if let Some(e) = v.iter_mut().find(|e| e.0 == t) {
                    e.1 = to;
                } else if v.len() + 1 < FEW_EDGES {
                    v.push((t, to));
                } else {
                    let mut m: HashMap<u32, u32> = v.drain(..).collect();
                    m.insert(t, to);
                    *self = Edges::Many(m);
                }
            }
            Edges::Many(m) => {
                m.insert(t, to);
            }
        }
    }
}

#[derive(Debug, Clone)]
struct State {
    /// Length of the longest string of the state.
    len: u32,
    /// Suffix link (`NONE` for the root).
    link: u32,
    /// Latest end (inclusive index) of the state's strings seen so far.
    last: u32,
    edges: Edges,
}

/// The suffix automaton of one sequence (see the module doc).
#[derive(Debug, Clone)]
pub struct SuffixIndex {
    st: Vec<State>,
    /// State of the whole text indexed.
    last: u32,
    /// Tokens indexed.
    n: usize,
    /// For the text indexed: `(length, latest earlier end)` of its longest suffix that also ends
    /// earlier, or `None`.
    matched: Option<(u32, u32)>,
}

impl Default for SuffixIndex {
    fn default() -> Self {
        SuffixIndex {
            st: vec![State { len: 0, link: NONE, last: 0, edges: Edges::Few(Vec::new()) }],
            last: 0,
            n: 0,
            matched: None,
        }
    }
}

impl SuffixIndex {
    /// Forgets everything (the sequence's tokens changed other than by appending).
    pub fn reset(&mut self) {
        *self = SuffixIndex::default();
    }

    /// Tokens indexed.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Appends token `c` (at position `self.len()`).
    pub fn push(&mut self, c: u32) {
        let pos = self.n as u32;
        let cur = self.st.len() as u32;
        let len = self.st[self.last as usize].len + 1;
        self.st.push(State { len, link: 0, last: pos, edges: Edges::Few(Vec::new()) });
        let mut p = self.last;
        while p != NONE && self.st[p as usize].edges.get(c).is_none() {
            self.st[p as usize].edges.set(c, cur);
            p = self.st[p as usize].link;
        }
        if p != NONE {
            let q = self.st[p as usize].edges.get(c).expect("the loop stopped at an edge");
            if self.st[p as usize].len + 1 == self.st[q as usize].len {
                self.st[cur as usize].link = q;
            } else {
                let clone = self.st.len() as u32;
                let qs = &self.st[q as usize];
                // its strings end where q's do, and at `pos`: q's latest is the latest earlier
                let c_state = State { len: self.st[p as usize].len + 1, link: qs.link, last: qs.last, edges: qs.edges.clone() };
                self.st.push(c_state);
                while p != NONE && self.st[p as usize].edges.get(c) == Some(q) {
                    self.st[p as usize].edges.set(c, clone);
                    p = self.st[p as usize].link;
                }
                self.st[q as usize].link = clone;
                self.st[cur as usize].link = clone;
            }
        }
        self.last = cur;
        let v = self.st[cur as usize].link;
        self.matched = (v != 0).then(|| (self.st[v as usize].len, self.st[v as usize].last));
        let mut u = v;
        for _ in 0..LAST_WALK {
            if u == 0 || u == NONE {
                break;
            }
            self.st[u as usize].last = pos;
            u = self.st[u as usize].link;
        }
        self.n += 1;
    }

    /// Indexes `tokens[self.len()..]` (`tokens` extends what was indexed).
    pub fn extend(&mut self, tokens: &[u32]) {
        for &t in &tokens[self.n.min(tokens.len())..] {
            self.push(t);
        }
    }

    /// The longest suffix of `tail` that occurs in the indexed text: `(its length, the latest end
    /// (inclusive) of an occurrence)`, or `None` when not even its last token occurs. Walks `tail`
    /// through the automaton (O(len(tail)) amortized: the matching statistics of Blumer et al.).
    pub fn longest_match(&self, tail: &[u32]) -> Option<(usize, usize)> {
        let (mut v, mut l) = (0u32, 0usize);
        for &t in tail {
            loop {
                if let Some(n) = self.st[v as usize].edges.get(t) {
                    v = n;
                    l += 1;
                    break;
                }
                if v == 0 {
                    l = 0;
                    break;
                }
                v = self.st[v as usize].link;
                l = self.st[v as usize].len as usize;
            }
        }
        (l > 0).then(|| (l, self.st[v as usize].last as usize))
    }

    /// Up to `min(k, match length)` tokens proposed to follow `tokens` (which extends what was
    /// indexed) into `out` (cleared first). Returns the length of the suffix matched (0: none).
    pub fn propose(&mut self, tokens: &[u32], k: usize, out: &mut Vec<u32>) -> usize {
        out.clear();
        self.extend(tokens);
        let Some((len, end)) = self.matched else { return 0 };
        copy_continuation(tokens, end as usize + 1, k.min(len as usize), out);
        len as usize
    }
}

/// Separates the texts of a [`ConversationIndex`] (not a token id: nothing matches across it).
const SEPARATOR: u32 = u32::MAX;
/// Tokens of a sequence's end matched against a conversation's earlier outputs.
const MATCH_TAIL: usize = 64;

/// The outputs of a conversation's earlier requests (`X-Fak-Conversation`), indexed: a sequence of
/// the same conversation also drafts from them ([`ConversationIndex::propose`]). Agent traffic
/// regenerates what earlier turns generated (a resampled tool call, reasoning the chat template
/// left out of later prompts) without it being in the prompt.
#[derive(Debug, Default, Clone)]
pub struct ConversationIndex {
    index: SuffixIndex,
    tokens: Vec<u32>,
}

impl ConversationIndex {
    /// Appends one request's output (a document of its own).
    pub fn add(&mut self, output: &[u32]) {
        if output.is_empty() {
            return;
        }
        for &t in output.iter().chain(std::iter::once(&SEPARATOR)) {
            self.tokens.push(t);
            self.index.push(t);
        }
    }

    /// Tokens held (outputs and separators).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The longest suffix (up to 64 tokens) of `tokens` that an earlier output holds proposes
    /// what followed it there, as many tokens as the match is long, up to `k` (never past the end
    /// of that output), into `out` (cleared first). Returns the match length (0: none).
    pub fn propose(&self, tokens: &[u32], k: usize, out: &mut Vec<u32>) -> usize {
        out.clear();
        let tail = &tokens[tokens.len().saturating_sub(MATCH_TAIL)..];
        let Some((len, end)) = self.index.longest_match(tail) else { return 0 };
        out.extend(self.tokens[end + 1..].iter().take(k.min(len)).take_while(|&&t| t != SEPARATOR));
        len
    }
}

/// The [`ConversationIndex`] of each conversation, the most recently used [`MAX_CONVERSATIONS`],
/// each at most [`MAX_CONVERSATION_TOKENS`] (past it, it starts again from the latest output).
#[derive(Debug, Default)]
pub struct ConversationStore {
    convs: std::collections::HashMap<u64, (ConversationIndex, u64)>,
    clock: u64,
}

/// Conversations a [`ConversationStore`] keeps.
pub const MAX_CONVERSATIONS: usize = 256;
/// Tokens one conversation's index holds.
pub const MAX_CONVERSATION_TOKENS: usize = 1 << 17;

impl ConversationStore {
    /// The index of conversation `id`, if it has one.
    pub fn get(&self, id: u64) -> Option<&ConversationIndex> {
        self.convs.get(&id).map(|e| &e.0)
    }

    /// Adds a finished request's `output` to conversation `id`.
    pub fn add(&mut self, id: u64, output: &[u32]) {
        if output.is_empty() {
            return;
        }
        self.clock += 1;
        let clock = self.clock;
        if !self.convs.contains_key(&id) && self.convs.len() >= MAX_CONVERSATIONS {
            if let Some(old) = self.convs.iter().min_by_key(|e| e.1 .1).map(|e| *e.0) {
                self.convs.remove(&old);
            }
        }
        let e = self.convs.entry(id).or_default();
        e.1 = clock;
        if e.0.len() + output.len() + 1 > MAX_CONVERSATION_TOKENS {
            e.0 = ConversationIndex::default();
        }
        let keep = output.len().min(MAX_CONVERSATION_TOKENS - 1);
        e.0.add(&output[output.len() - keep..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_outputs_draft_for_a_later_request() {
        let mut store = ConversationStore::default();
        let call: Vec<u32> = (500..530).collect(); // an earlier reply: a tool call
        store.add(7, &[1, 2, 3]);
        store.add(7, &call);
        let c = store.get(7).unwrap();
        assert!(store.get(8).is_none());
        let mut out = Vec::new();
        // a later request of the conversation starts writing the same call
        let seq: Vec<u32> = vec![9, 9, 9, 500, 501, 502, 503];
        assert_eq!(c.propose(&seq, 8, &mut out), 4);
        assert_eq!(out, vec![504, 505, 506, 507]);
        // never past the end of the output it matched
        assert_eq!(c.propose(&[526, 527, 528], 8, &mut out), 3);
        assert_eq!(out, vec![529]);
        // nothing matches across two outputs
        assert_eq!(c.propose(&[3, 500], 8, &mut out), 1);
        assert_eq!(out, vec![501]);
        assert_eq!(c.propose(&[77], 8, &mut out), 0);
        assert!(out.is_empty());
    }

    /// The longest suffix of `t` that also ends earlier, and its latest earlier end, by brute force.
    fn brute(t: &[u32]) -> Option<(usize, usize)> {
        let n = t.len();
        for len in (1..n).rev() {
            let suf = &t[n - len..];
            if let Some(e) = (len - 1..n - 1).rev().find(|&e| &t[e + 1 - len..=e] == suf) {
                return Some((len, e));
            }
        }
        None
    }

    #[test]
    fn matches_brute_force_longest_suffix() {
        let mut x = 12345u64;
        for alphabet in [2u64, 3, 5, 50] {
            let mut ix = SuffixIndex::default();
            let mut t = Vec::new();
            for _ in 0..400 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                t.push((x % alphabet) as u32);
                ix.push(*t.last().unwrap());
                let want = brute(&t);
                let got = ix.matched.map(|(l, e)| (l as usize, e as usize));
                assert_eq!(got.map(|g| g.0), want.map(|w| w.0), "length at {}", t.len());
                if let (Some((l, e)), Some(_)) = (got, want) {
                    // a valid earlier occurrence; the latest one for long matches
                    assert!(e + 1 < t.len() && t[e + 1 - l..=e] == t[t.len() - l..], "occurrence at {}", t.len());
                    if alphabet == 50 {
                        assert_eq!(Some((l, e)), want, "latest occurrence at {}", t.len());
                    }
                }
            }
        }
    }

    #[test]
    fn proposes_as_far_as_the_match_is_long() {
        let mut ix = SuffixIndex::default();
        let mut out = Vec::new();
        let file: Vec<u32> = (100..140).collect();
        let mut t: Vec<u32> = vec![1, 2];
        t.extend(&file);
        t.extend([3, 4]);
        t.extend(&file[..10]); // re-emitting the file: a 10-token match
        assert_eq!(ix.propose(&t, 8, &mut out), 10);
        assert_eq!(out, (110..118).collect::<Vec<u32>>());
        t.extend([7, 102]); // "102" alone matched: one token
        assert_eq!(ix.propose(&t, 8, &mut out), 1);
        assert_eq!(out, vec![103]);
    }
}
