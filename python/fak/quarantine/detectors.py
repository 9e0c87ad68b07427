"""Deterministic prompt-injection detectors over the text of one tool result.

Four detector families, each a set of weighted *features* (a regex or a count, with a stable id
such as ``override.ignore_previous``). A family fires when the sum of its feature weights reaches
its threshold (1.0 by default); :func:`scan` returns every finding and the families that fired.

- ``role_markup``: chat-template and tool-call markup inside a result: the served model's control
  tokens (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>`` and any ``<|name|>`` token),
  Qwen/Hermes ``<tool_call>``/``<tool_response>`` blocks, Llama ``[INST]``/``<<SYS>>``,
  Bing-style ``[system](#...)`` links, AgentDojo's ``###(system_message)``, and fake conversation
  turns in plain text (``User:``, ``[assistant]:``, ``### System``, ``**Human:**``, ``Usuario:``,
  ...) whose user or system turn carries a payload (:mod:`fak.quarantine.addressed`). A bare turn
  marker or an Alpaca ``### Instruction:`` header weighs too little to fire: chat-format examples
  in docs and tests pass. A control token in a result is never harmless in fak's engine: the
  gateway tokenizes the rendered prompt with special tokens parsed, so the text *becomes* a turn
  boundary.
- ``override``: instruction-override phrasing ("ignore all previous instructions", "your new
  task is", "do not tell the user", AgentDojo's "important message ... before you can solve the
  task", InjecAgent's "IMPORTANT!!! ... strictly adhere", Tensor Trust's prompt-extraction and
  fake boundary lines), its paraphrases ("set aside your prior guidance", "the previous
  instructions are void"), in ten languages (zh, ja, ko, es, pt, de, fr, ru, it, nl), also when
  spelled with separators, leetspeak or homoglyphs; and instructions addressed to the model in
  prose ("To the AI assistant reading this: ...", "Dear assistant, ...", "Agent, stop here.")
  when a payload follows the address (:mod:`fak.quarantine.addressed`).
- ``exec_request``: requests to run commands or to exfiltrate: a download piped to a shell, a
  base64 blob piped to a shell, reverse shells, secrets sent to a URL or address, credential
  files read into a network command, markdown images whose URL carries a placeholder.
- ``hidden_text``: text a human reviewer would not see: Unicode tag characters (ASCII
  smuggling), bidi controls (Trojan Source), zero-width characters, HTML comments / CSS-hidden
  elements / markdown comments / base64 or hex blobs / ROT13 text that says so / whitespace-padded
  tails that carry instructions.

Two *booster* features, addressing the AI ("note to the AI agent", "dear assistant") and urgency
("immediately", "you must", "IMPORTANT:"), add to ``override`` and ``exec_request`` only when the
family has a base finding of its own within :data:`BOOST_SPAN` characters; on their own they never
fire.

Text that *talks about* injection (security docs, tests of a filter) quotes the phrases: a
phrase match inside quotes or backticks, or within a short distance of words like "attack",
"injection", "example", "such as", counts ``META_FACTOR`` of its weight. Control tokens are
exempt from this (see ``role_markup``).

Sources the families were designed from (read, not copied): BIPIA (Yi et al. 2023, task-
irrelevant and code attacks), InjecAgent (Zhan et al. 2024, base and "enhanced" attacker
instructions), AgentDojo (Debenedetti et al. 2024, ``important_instructions``,
``ignore_previous``, ``tool_knowledge`` attacks), Tensor Trust (Toyer et al. 2023, hijacking and
prompt extraction), Greshake et al. 2023 (indirect injection through hidden web content),
Trojan Source (Boucher & Anderson 2021, bidi controls), the Unicode-tag "ASCII smuggling"
technique, and for the multilingual rules deepset/prompt-injections (German) and translated
"ignore previous instructions" sets. ``tests/data/quarantine_injected.jsonl`` (tuning),
``tests/data/quarantine_heldout.jsonl`` (never tuned on) and the benign corpora measure them
(``benches/results/quarantine-recall.md``).

Every function here is pure and thread-safe; the compiled patterns are module constants.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import dataclasses
import functools
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

from fak.quarantine import addressed

__all__ = [
    "FAMILIES",
    "FAMILY_DESCRIPTIONS",
    "META_FACTOR",
    "Finding",
    "HiddenTextLimits",
    "ScanResult",
    "scan",
]

ROLE_MARKUP, OVERRIDE, EXEC_REQUEST, HIDDEN_TEXT = "role_markup", "override", "exec_request", "hidden_text"
FAMILIES = (ROLE_MARKUP, OVERRIDE, EXEC_REQUEST, HIDDEN_TEXT)
FAMILY_DESCRIPTIONS = {
    ROLE_MARKUP: "fake role or tool-call markup",
    OVERRIDE: "instruction override",
    EXEC_REQUEST: "request to run commands or exfiltrate data",
    HIDDEN_TEXT: "hidden text",
}
#: Weight multiplier of a phrase match that is quoted or discussed (meta context).
META_FACTOR = 0.25
#: Boosters add to a family only when its own findings weigh at least this much.
BOOST_MIN_BASE = 0.4
#: ... and only when they lie within this many characters of one (a booster at the other end of
#: a long file says nothing about a finding here).
BOOST_SPAN = 400
#: Weight multiplier of findings inside a hidden carrier (comment, hidden element, base64, tags).
HIDDEN_FACTOR = 1.5
_BOOST = "boost"


@dataclass(frozen=True, slots=True)
class Finding:
    """One feature that matched: ``family``, ``feature`` id, ``weight`` (after context factors),
    ``start``/``end`` offsets (characters of the scanned text; ``-1`` for counts)."""

    family: str
    feature: str
    weight: float
    start: int = -1
    end: int = -1


@dataclass(frozen=True, slots=True)
class HiddenTextLimits:
    """Parameters of ``hidden_text``: invisible characters tolerated (bidi controls, zero-width
    characters outside emoji and joining scripts), and the whitespace run (characters) after
    which trailing text counts as hidden: with an instruction in it at ``padding_chars``, any text
    at ``padding_chars_any``."""

    max_bidi: int = 0
    max_zero_width: int = 2
    padding_chars: int = 256
    padding_chars_any: int = 4096


@dataclass(slots=True)
class ScanResult:
    """What :func:`scan` found: ``findings`` in order, ``scores`` per family (boosters
    included), ``fired`` families (score ≥ threshold), in :data:`FAMILIES` order."""

    findings: list[Finding] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    fired: list[str] = field(default_factory=list)

    @property
    def features(self) -> list[str]:
        """Feature ids of the findings of the fired families (deduplicated, in order)."""
        fired = set(self.fired)
        return list(dict.fromkeys(f.feature for f in self.findings if f.family in fired or
                                  (f.family == _BOOST and fired & {OVERRIDE, EXEC_REQUEST})))


# --------------------------------------------------------------------------------------------
# normalization

_INVISIBLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
                        "\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\U000e0000-\U000e0fff]")
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")
_ZERO_WIDTH = re.compile("[\u200b-\u200d\u2060-\u2064\u180e\ufeff\u034f\u115f\u1160\u3164\uffa0]")
_TAGS = re.compile("[\U000e0000-\U000e007f]+")
# Cyrillic/Greek/Latin-extended letters that look like ASCII ones (a few dozen of Unicode's
# confusables.txt, the ones used in practice to dodge keyword filters).
_CONFUSABLES = str.maketrans({
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i", "ј": "j",
    "ѕ": "s", "ԁ": "d", "ԛ": "q", "ԝ": "w", "һ": "h", "ӏ": "l", "ɡ": "g", "ı": "i", "ո": "n",
    "ν": "v", "ο": "o", "ρ": "p", "τ": "t", "α": "a", "ε": "e", "ι": "i", "κ": "k", "υ": "u",
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C",
    "Т": "T", "Х": "X", "І": "I", "Ѕ": "S", "Ј": "J", "Α": "A", "Β": "B", "Ε": "E", "Η": "H",
    "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O", "Ρ": "P", "Τ": "T", "Χ": "X", "Υ": "Y",
    "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
})
# Collapsed view: letters only, with common leetspeak digits mapped to letters (bytes tables).
_LEET = {ord("0"): ord("o"), ord("1"): ord("i"), ord("3"): ord("e"), ord("4"): ord("a"), ord("5"): ord("s"),
         ord("7"): ord("t"), ord("@"): ord("a"), ord("$"): ord("s")}
_COLLAPSE_TABLE = bytes(_LEET.get(c, c) for c in range(256))
_COLLAPSE_DELETE = bytes(c for c in range(256) if not (97 <= c <= 122 or c in _LEET))


def _collapse(low: str) -> str:
    """Letters only (leetspeak digits as letters) of a lower-cased text."""
    return low.encode("ascii", "ignore").translate(_COLLAPSE_TABLE, _COLLAPSE_DELETE).decode("ascii")


_CONFUSABLE_RX = re.compile("[" + "".join(sorted(chr(k) for k in _CONFUSABLES)) + "]")


_ASCII_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _fold_mixed(t: str) -> str:
    """``t`` with every word that mixes ASCII letters and lookalikes from other scripts folded to
    ASCII (``Ιgnοre`` → ``Ignore``); a word in one script is kept (``инструкции``, ``ουρά``). Only
    the words around a lookalike are looked at."""
    out: list[str] = []
    done = 0
    for m in _CONFUSABLE_RX.finditer(t):
        i = m.start()
        if i < done:
            continue
        a = i
        while a > 0 and t[a - 1].isalpha():
            a -= 1
        b = i + 1
        while b < len(t) and t[b].isalpha():
            b += 1
        word = t[a:b]
        if not _ASCII_LETTERS.isdisjoint(word):
            out.append(t[done:a])
            out.append(_CONFUSABLE_RX.sub(lambda c: _CONFUSABLES[ord(c.group())], word))
            done = b
    if not out:
        return t
    out.append(t[done:])
    return "".join(out)


def _normalize(text: str) -> str:
    """NFKC, confusables folded to ASCII, invisible characters removed (non-ASCII text only;
    each step only when the text needs it)."""
    t = text if unicodedata.is_normalized("NFKC", text) else unicodedata.normalize("NFKC", text)
    if _CONFUSABLE_RX.search(t) is not None:
        t = _fold_mixed(t)
    if _INVISIBLE.search(t) is not None:
        t = _INVISIBLE.sub("", t)
    return t


# --------------------------------------------------------------------------------------------
# feature tables
#
# A rule's regex runs over the whole text only when its *gate* passes: an AND of groups, each an
# OR of lower-case words (looked up in the set of the text's words, punctuation split off) or
# other strings (searched as substrings). Gates keep the cost near one pass over the text for
# the usual benign result, where no gate passes (Python's ``re`` spends ~100 ns per character
# on a pattern that starts with an alternation; a set lookup costs nothing).

_F = re.IGNORECASE | re.MULTILINE
_WORD = re.compile(r"[a-z0-9_]+")
_SPLIT = bytes(c if (48 <= c <= 57 or 97 <= c <= 122 or c == 95 or c >= 128) else 32 for c in range(256))


@dataclass(frozen=True, slots=True)
class _Group:
    words: frozenset[bytes]
    subs: tuple[str, ...]      # ASCII substrings
    wide: tuple[str, ...] = ()  # other substrings: only an ASCII-only text is known to lack them


@dataclass(frozen=True, slots=True)
class _Rule:
    feature: str
    family: str
    weight: float
    gate: tuple[_Group, ...]
    rx: re.Pattern[str]
    meta: bool = True          # reduced in quoted / meta context
    once: bool = True          # count the first match only
    anchors: tuple[str, ...] = ()  # every match starts at most ``back`` characters before one
    back: int = 0
    span: int = 640                # and ends at most ``span`` characters after it
    whole: bool = True             # every anchor is a whole word of any match (absent words skip)

    def open(self, low: str, words: set[bytes], ascii_only: bool = False) -> bool:
        """Whether the gate passes for the lower-cased text ``low`` with word set ``words``
        (``ascii_only``: the text is ASCII, so no non-ASCII substring can be in it)."""
        for g in self.gate:
            if g.words.isdisjoint(words) and not any(x in low for x in g.subs) and \
                    (ascii_only or not any(x in low for x in g.wide)):
                return False
        return True


def _r(feature: str, family: str, weight: float, gate: Iterable[str] | Iterable[Iterable[str]], pattern: str, *,
       meta: bool = True, once: bool = True, flags: int = _F, anchors: Iterable[str] | None = None,
       back: int = 0) -> _Rule:
    items = tuple(gate)
    groups: tuple[tuple[str, ...], ...] = ((tuple(g for g in items if isinstance(g, str)),)
                                          if all(isinstance(g, str) for g in items)
                                          else tuple(tuple(grp) for grp in items if not isinstance(grp, str)))
    # a gate string is a word of the text, or (not a word, or marked with a leading ``*``) a substring
    built = tuple(_Group(frozenset(w.encode() for w in grp if _WORD.fullmatch(w)),
                         tuple(w.lstrip("*").lower() for w in grp if not _WORD.fullmatch(w) and w.isascii()),
                         tuple(w.lower() for w in grp if not w.isascii())) for grp in groups)
    anchor = tuple(a.lstrip("*") for a in anchors) if anchors is not None else tuple(g.lstrip("*") for g in groups[0])
    if family in (EXEC_REQUEST, _BOOST):
        meta = False  # attackers quote commands in backticks too; these need a target signal anyway
    return _Rule(feature, family, weight, built, re.compile(pattern, flags), meta, once, anchor, back)


_LEAD = re.compile(r"[a-z0-9_]+")


@functools.lru_cache(maxsize=1024)
def _lead_word(anchor: str, whole: bool) -> bytes | None:
    """The word an anchor starts with when a match needs it as a whole word of the text
    (``"note "`` → ``note``; a bare word only when the rule says its anchors are whole words)."""
    m = _LEAD.match(anchor)
    if m is None:
        return None
    rest = anchor[m.end():]
    if not rest and not whole:
        return None
    return m.group(0).encode() if not rest or not (rest[0].isalnum() or rest[0] == "_") else None


def _matches(rule: _Rule, text: str, low: str, words: set[bytes]) -> Iterable[re.Match[str]]:
    """Matches of ``rule`` in ``text``: at the start positions each anchor allows (at most
    ``back`` characters before it; a rule with a long ``back`` searches windows instead)."""
    n = len(text)
    if not rule.anchors or len(low) != n:
        yield from rule.rx.finditer(text)
        return
    if rule.back > 64:
        for lo, hi in _windows(low, rule, n, words):
            yield from rule.rx.finditer(text, lo, hi)
        return
    spots: list[int] = []
    for a in rule.anchors:
        lead = _lead_word(a, rule.whole)
        if lead is not None and lead not in words:
            continue
        i = low.find(a)
        while i >= 0:
            spots.append(i)
            i = low.find(a, i + 1)
    spots.sort()
    done = -1  # matches may not overlap
    match = rule.rx.match
    for i in spots:
        end = min(n, i + rule.span)
        for start in range(max(done, i - rule.back, 0), i + 1):
            m = match(text, start, end)
            if m is not None:
                yield m
                done = m.end()
                break


def _windows(low: str, rule: _Rule, n: int, words: set[bytes]) -> list[tuple[int, int]]:
    """Merged ``(start, end)`` windows of ``low`` (length ``n``) around every anchor of ``rule``
    (an anchor that starts with a word the text does not have is skipped without a search)."""
    spots: list[int] = []
    for a in rule.anchors:
        lead = _lead_word(a, rule.whole)
        if lead is not None and lead not in words:
            continue
        i = low.find(a)
        while i >= 0:
            spots.append(i)
            if len(spots) > 4096:
                return [(0, n)]
            i = low.find(a, i + 1)
    spots.sort()
    out: list[tuple[int, int]] = []
    for i in spots:
        lo, hi = max(0, i - rule.back), min(n, i + rule.span)
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _words(low: str) -> set[bytes]:
    """The words of a lower-cased text (runs of ``[a-z0-9_]`` and non-ASCII), as bytes."""
    return set(low.encode("utf-8", "surrogatepass").translate(_SPLIT).split())


_PREV = (r"(?:previous|prior|above|earlier|preceding|former|original|initial|system|old|existing|foregoing|"
         r"other|prev\.?)")
_INSTR = (r"(?:\w{0,3}nstruct\w*|directions?|prompts?|rules|guidelines|guidance|directives?|commands?|orders|constraints|"
          r"guardrails|programming|context|messages|tasks?|restrictions|policies|system\s+prompt|training)")
_QUAL = r"(?:(?:all|any|the|your|my|of|every|these|those|the\s+user'?s|user|their)\s+)*"
# between a verb and its object: blanks, or a line break into unindented prose (not into code)
_GAP = r"(?:[ \t]+|[ \t]*\r?\n[ \t]{0,3}(?=[a-z]))"
_VERBS_I = r"(?:ignore|ignoring|disregard|disregarding|forget|forgetting|neglect|discard|abandon)"
_PREV_STRONG = r"(?:previous|prior|above|earlier|preceding|former|original|initial|foregoing|prev\.?)"
_PREV_WEAK = r"(?:other|existing|old|system)"
_INSTR_NARROW = (r"(?:\w{0,3}nstruct\w*|directives?|guidelines|guidance|prompts?|system\s+prompt|guardrails|"
                 r"programming)")
_VERBS = r"(?:ignore|ignoring|disregard|disregarding|forget|forgetting|override|bypass|neglect|discard|abandon)"

# Other verbs of "ignore previous instructions" (only with an instruction noun and a "previous", "your" or
# "you were given": "skip the rules" alone is a linter's manual).
_VERBS2 = (r"(?:drop|set\s+aside|put\s+aside|throw\s+(?:away|out)|scrap|dismiss|pay\s+no\s+attention\s+to|"
           r"stop\s+following|do\s+not\s+follow|don't\s+follow|dont\s+follow|never\s*mind|reset|skip|overrule)")
_NOUN2 = (r"(?:instructions?|directives?|directions|guidance|guidelines|rules|prompts?|system\s+prompt|orders|"
          r"programming|constraints|restrictions)")
_NOUN2V = r"(?:instructions?|directives?|directions|guidance|guidelines|rules|prompts?|orders|commands|programming)"

# Multilingual forms, written for fak from the phrasings of public multilingual injection sets
# (deepset/prompt-injections' German, translated "ignore previous instructions" variants).
_ML_IGNORE = re.compile(
    # zh: ignore/forget (your) previous/above/all ... instructions/rules/prompts
    "(?:\u5ffd\u7565|\u65e0\u89c6|\u5ffd\u89c6|\u5fd8\u8bb0|\u5fd8\u6389|\u4e0d\u8981\u7406\u4f1a|\u522b\u7406\u4f1a|"
    "\u4e0d\u7406\u4f1a|\u629b\u5f00|\u653e\u5f03)(?:\u6389)?(?:\u4f60|\u60a8)?(?:\u7684)?"
    "(?:\u4e4b\u524d|\u4ee5\u524d|\u5148\u524d|\u6b64\u524d|\u4e0a\u9762|\u4e0a\u8ff0|\u524d\u9762|\u4ee5\u4e0a|"
    "\u539f\u6765|\u539f\u5148|\u539f\u6709|\u6700\u521d|\u6240\u6709|\u5168\u90e8|\u4e00\u5207)(?:\u7684)?"
    "(?:\u6240\u6709|\u5168\u90e8|\u4e00\u5207)?(?:\u7684)?(?:\u6307\u4ee4|\u6307\u793a|\u8bf4\u660e|\u547d\u4ee4|"
    "\u89c4\u5219|\u63d0\u793a\u8bcd|\u63d0\u793a|\u8981\u6c42|\u8bbe\u5b9a|\u7ea6\u675f|\u9650\u5236)"
    # ja: (previous/above/so-far) instructions/commands/rules (all) ignore/forget
    "|(?:\u4ee5\u524d|\u524d|\u3053\u308c\u307e\u3067|\u4e0a\u8a18|\u4e0a|\u5148\u307b\u3069|\u6700\u521d|\u5143)"
    "\u306e(?:\u3059\u3079\u3066\u306e|\u5168\u3066\u306e|\u5168\u90e8\u306e)?(?:\u6307\u793a|\u547d\u4ee4|"
    "\u30eb\u30fc\u30eb|\u30d7\u30ed\u30f3\u30d7\u30c8|\u6307\u4ee4|\u8a2d\u5b9a|\u5236\u7d04)(?:\u306f|\u3092)?"
    "(?:\u3059\u3079\u3066|\u5168\u3066|\u5168\u90e8)?(?:\u7121\u8996|\u5fd8\u308c|\u7834\u68c4)"
    # ko: previous (all) instructions ... ignore/forget
    "|\uc774\uc804\uc758?\\s*(?:\ubaa8\ub4e0\\s*)?(?:\uc9c0\uc2dc|\uba85\ub839|\uc9c0\uce68|\uaddc\uce59|"
    "\ud504\ub86c\ud504\ud2b8)(?:\ub97c|\uc744|\uc740|\ub294|\uc0ac\ud56d\uc744)?\\s*(?:\ubaa8\ub450\\s*)?"
    "(?:\ubb34\uc2dc|\uc78a)"
    # es / pt
    r"|\b(?:ignora|ignore|ignorad|ignoren|ignorar|olvida|olvide|olviden|olvidad|olvidar|descarta|descarte|omite|"
    r"omita|haz\s+caso\s+omiso\s+(?:de|a)|no\s+(?:hagas|haga)\s+caso\s+(?:de|a)|esque[\u00e7c]a|desconsidere)\s+"
    r"(?:todas?\s+|tus\s+|sus\s+|las\s+|los\s+|as\s+|os\s+|suas\s+|tuas\s+)*(?:instrucciones|indicaciones|"
    r"[\u00f3o]rdenes|reglas|directrices|directivas|normas|comandos|consignas|instru[\u00e7c][\u00f5o]es|ordens|"
    r"regras|diretrizes)\s+(?:anteriores|previas|previos|pr[\u00e9e]vias|de\s+arriba|acima|originales|originais|"
    r"iniciales|que\s+(?:te|le)\s+(?:dieron|han\s+dado|di))"
    # de
    r"|\b(?:ignoriere|ignorier|ignorieren\s+sie|vergiss|vergessen\s+sie|missachte|missachten\s+sie|verwirf|"
    r"verwerfen\s+sie|[\u00fcu]bergehe|[\u00fcu]bergehen\s+sie)\s+(?:bitte\s+)?(?:alle\s+|die\s+|deine\s+|ihre\s+|"
    r"s[\u00e4a]mtliche\s+|jegliche\s+)*(?:vorherigen|bisherigen|obigen|vorigen|fr[\u00fcu]heren|vorangegangenen|"
    r"urspr[\u00fcu]nglichen|alten|vorangehenden)\s+(?:anweisungen|befehle|instruktionen|regeln|vorgaben|"
    r"anordnungen|richtlinien)"
    r"|\b(?:vergiss|vergessen\s+sie)\s+alles,?\s+was\s+(?:dir|ihnen|man\s+dir|ich\s+dir)\s+(?:vorher|bisher|zuvor)?"
    r"\s*(?:gesagt|befohlen|aufgetragen)"
    # fr
    r"|\b(?:ignore[zs]?|oublie[zs]?|n[\u00e9e]glige[zs]?|ne\s+tiens\s+pas\s+compte|ne\s+tenez\s+pas\s+compte|"
    r"fais\s+abstraction|faites\s+abstraction)\s+(?:de\s+|des\s+|d')?(?:toutes\s+|tous\s+|les\s+|tes\s+|vos\s+|"
    r"ces\s+)*(?:instructions|consignes|directives|r[\u00e8e]gles|ordres|commandes|indications)\s+(?:pr[\u00e9e]"
    r"c[\u00e9e]dentes|ant[\u00e9e]rieures|ci-dessus|initiales|originales|d'avant)"
    # ru
    "|(?:\u0438\u0433\u043d\u043e\u0440\u0438\u0440\u0443\u0439(?:\u0442\u0435)?|\u0438\u0433\u043d\u043e\u0440"
    "\u0438\u0440\u043e\u0432\u0430\u0442\u044c|\u0437\u0430\u0431\u0443\u0434\u044c(?:\u0442\u0435)?|\u0437\u0430"
    "\u0431\u044b\u0442\u044c|\u043d\u0435\\s+\u043e\u0431\u0440\u0430\u0449\u0430\u0439(?:\u0442\u0435)?\\s+"
    "\u0432\u043d\u0438\u043c\u0430\u043d\u0438\u044f\\s+\u043d\u0430|\u043e\u0442\u0431\u0440\u043e\u0441\u044c"
    "(?:\u0442\u0435)?|\u043f\u0440\u0435\u043d\u0435\u0431\u0440\u0435\u0433\u0438(?:\u0442\u0435)?)\\s+"
    "(?:(?:\u0432\u0441\u0435|\u0432\u0441\u0451|\u0441\u0432\u043e\u0438|\u0442\u0432\u043e\u0438|\u0432\u0430"
    "\u0448\u0438|\u044d\u0442\u0438)\\s+)*(?:\u043f\u0440\u0435\u0434\u044b\u0434\u0443\u0449\u0438\u0435|\u043f"
    "\u0440\u0435\u0436\u043d\u0438\u0435|\u043f\u0440\u0435\u0434\u0448\u0435\u0441\u0442\u0432\u0443\u044e\u0449"
    "\u0438\u0435|\u0432\u044b\u0448\u0435\u0443\u043a\u0430\u0437\u0430\u043d\u043d\u044b\u0435|\u0432\u044b\u0448"
    "\u0435\u043f\u0440\u0438\u0432\u0435\u0434[\u0435\u0451]\u043d\u043d\u044b\u0435|\u0440\u0430\u043d\u0435\u0435"
    "\\s+\u0434\u0430\u043d\u043d\u044b\u0435|\u0441\u0442\u0430\u0440\u044b\u0435|\u0438\u0437\u043d\u0430\u0447"
    "\u0430\u043b\u044c\u043d\u044b\u0435|\u0438\u0441\u0445\u043e\u0434\u043d\u044b\u0435|\u043f\u0440\u043e\u0448"
    "\u043b\u044b\u0435)\\s+(?:\u0438\u043d\u0441\u0442\u0440\u0443\u043a\u0446\u0438\u0438|\u0443\u043a\u0430\u0437"
    "\u0430\u043d\u0438\u044f|\u043a\u043e\u043c\u0430\u043d\u0434\u044b|\u043f\u0440\u0430\u0432\u0438\u043b\u0430"
    "|\u0440\u0430\u0441\u043f\u043e\u0440\u044f\u0436\u0435\u043d\u0438\u044f|\u0443\u0441\u0442\u0430\u043d\u043e"
    "\u0432\u043a\u0438|\u0434\u0438\u0440\u0435\u043a\u0442\u0438\u0432\u044b|\u0437\u0430\u0434\u0430\u043d\u0438"
    "\u044f|\u043f\u0440\u0438\u043a\u0430\u0437\u044b)"
    # it / nl
    r"|\b(?:ignora|ignorate|dimentica|dimenticate|trascura)\s+(?:tutte\s+)?(?:le\s+)?(?:istruzioni|indicazioni|"
    r"regole|direttive|comandi)\s+(?:precedenti|di\s+prima|sopra)"
    r"|\b(?:negeer|vergeet)\s+(?:alle\s+)?(?:de\s+)?(?:vorige|eerdere|voorgaande|bovenstaande)\s+(?:instructies|"
    r"opdrachten|regels)",
    re.IGNORECASE)
_ML_REAL_TASK = re.compile(
    "(?:\u4f60|\u60a8)(?:\u7684)?(?:\u771f\u6b63|\u5b9e\u9645|\u771f\u5b9e|\u65b0)(?:\u7684)?(?:\u4efb\u52a1|"
    "\u76ee\u6807|\u5de5\u4f5c|\u6307\u4ee4)"
    "|(?:\u672c\u5f53\u306e|\u771f\u306e|\u65b0\u3057\u3044|\u5b9f\u969b\u306e)(?:\u30bf\u30b9\u30af|\u4efb\u52d9|"
    "\u4ed5\u4e8b|\u76ee\u7684|\u6307\u793a)\u306f"
    "|(?:\uc9c4\uc9dc|\uc2e4\uc81c|\uc0c8\ub85c\uc6b4)\\s*(?:\uc784\ubb34|\uc791\uc5c5|\uacfc\uc81c)"
    r"|\btu\s+(?:verdadera|nueva|[\u00fau]nica|real|aut[\u00e9e]ntica)\s+(?:tarea|misi[\u00f3o]n)\b"
    r"|\ba\s+tua\s+(?:verdadeira|nova|[\u00fau]nica|real)\s+tarefa\b"
    r"|\b(?:deine|ihre)\s+(?:eigentliche|wahre|neue|echte|einzige|tats[\u00e4a]chliche)\s+aufgabe\b"
    r"|\b(?:ta|votre)\s+(?:vraie|v[\u00e9e]ritable|nouvelle|seule|r[\u00e9e]elle)\s+(?:t[\u00e2a]che|mission)\b"
    "|(?:\u0442\u0432\u043e\u044f|\u0432\u0430\u0448\u0430)\\s+(?:\u043d\u0430\u0441\u0442\u043e\u044f\u0449"
    "\u0430\u044f|\u043d\u043e\u0432\u0430\u044f|\u0438\u0441\u0442\u0438\u043d\u043d\u0430\u044f|\u0440\u0435\u0430"
    "\u043b\u044c\u043d\u0430\u044f|\u0435\u0434\u0438\u043d\u0441\u0442\u0432\u0435\u043d\u043d\u0430\u044f)\\s+"
    "(?:\u0437\u0430\u0434\u0430\u0447\u0430|\u0446\u0435\u043b\u044c|\u043c\u0438\u0441\u0441\u0438\u044f)"
    r"|\bil\s+tuo\s+(?:vero|nuovo|unico)\s+compito\b",
    re.IGNORECASE)
_ML_SECRECY = re.compile(
    "(?:\u4e0d\u8981|\u522b|\u5207\u52ff|\u4e0d\u5f97|\u4e0d\u53ef)(?:\u544a\u8bc9|\u901a\u77e5|\u63d0\u9192|"
    "\u900f\u9732|\u544a\u77e5|\u8ba9)(?:\u7ed9)?(?:\u7528\u6237|\u4f7f\u7528\u8005|\u4eba\u7c7b|\u4efb\u4f55\u4eba)"
    "|(?:\u30e6\u30fc\u30b6\u30fc|\u5229\u7528\u8005)(?:\u306b|\u3078)(?:\u306f)?(?:\u77e5\u3089\u305b|\u4f1d\u3048|"
    "\u8a00\u308f|\u6559\u3048|\u5831\u544a\u3057)(?:\u305a|\u306a\u3044\u3067)"
    "|(?:\uc0ac\uc6a9\uc790)(?:\uc5d0\uac8c)\\s*(?:\ub9d0\ud558\uc9c0|\uc54c\ub9ac\uc9c0)"
    r"|\bno\s+(?:le\s+)?(?:digas|diga|cuentes|informes|menciones|avises)\s+(?:nada\s+)?(?:(?:de\s+esto\s+)?(?:al|a\s+la|"
    r"a)\s+)?(?:usuari[oa]|nadie)\b|\bn[\u00e3a]o\s+(?:conte|diga)\s+(?:nada\s+)?ao\s+usu[\u00e1a]rio\b"
    r"|\b(?:sag|sage|erz[\u00e4a]hl|verrat|verrate)\w*\s+(?:dem|der|den)\s+(?:nutzer|benutzer|anwender)\w*\s+nichts\b"
    r"|\bohne\s+(?:den|dem)\s+(?:nutzer|benutzer)\w*\s+(?:zu\s+)?(?:informieren|fragen)"
    r"|\bne\s+(?:dis|dites)\s+rien\s+[\u00e0a]\s+l'utilisat|\bsans\s+(?:le\s+)?dire\s+[\u00e0a]\s+l'utilisat"
    "|\u043d\u0435\\s+(?:\u0433\u043e\u0432\u043e\u0440\u0438|\u0441\u043e\u043e\u0431\u0449\u0430\u0439|\u0440\u0430"
    "\u0441\u0441\u043a\u0430\u0437\u044b\u0432\u0430\u0439|\u0433\u043e\u0432\u043e\u0440\u0438\u0442\u0435|\u0441"
    "\u043e\u043e\u0431\u0449\u0430\u0439\u0442\u0435)\\s+(?:\u043e\u0431\\s+\u044d\u0442\u043e\u043c\\s+)?(?:\u043f"
    "\u043e\u043b\u044c\u0437\u043e\u0432\u0430\u0442\u0435\u043b\u044e|\u043d\u0438\u043a\u043e\u043c\u0443)"
    r"|\bnon\s+dire\s+(?:niente\s+)?all'utente\b",
    re.IGNORECASE)

RULES: tuple[_Rule, ...] = (
    # ---------------------------------------------------------------- role_markup
    _r("role_markup.control_token", ROLE_MARKUP, 1.0, (('<|',),), r"<\|[A-Za-z][A-Za-z0-9_]{1,40}\|>", meta=False),
    _r("role_markup.tool_call_tag", ROLE_MARKUP, 1.0, (('tool_call', 'tool_response', 'tool_result', 'function_call', 'function'), ('<tool_call', '</tool_call', '<tool_response', '</tool_response', '<function_call', '<function=', '<tool_result', '</tool_result')),
       r"</?(?:tool_call|tool_response|tool_result|function_call)\b[^>\n]{0,40}>|<function=[a-z_]", meta=False),
    _r("role_markup.inst", ROLE_MARKUP, 1.0, (('inst', 'sys'), ('[inst]', '[/inst]', '<<sys>>', '<</sys>>')),
       r"\[/?INST\]|<</?SYS>>", flags=re.MULTILINE),
    _r("role_markup.header", ROLE_MARKUP, 0.4, (('#',), ('system', 'instruction', 'instructions', 'assistant', 'response', 'human', 'user', 'input')),
       r"^[ \t]*#{2,4}[ \t]*(?:system|instructions?|assistant|response|human|user|input)[ \t]*:"),
    _r("role_markup.role_tag", ROLE_MARKUP, 1.0, (('system', 'assistant', 'sys', 'im_start', 'im_end', 'system_prompt'), ('<system', '</system', '<assistant', '</assistant', '[system]', '[assistant]', '<im_start', '<sys>')),
       r"</?(?:system|assistant|system_prompt|sys|im_start|im_end)>|\[(?:system|assistant)\]\(#\w*\)"),
    _r("role_markup.system_message", ROLE_MARKUP, 1.0, (("(system", "( system", "(admin", "(developer"),),
       r"#{2,4}\s*\(\s*(?:system|admin|developer)[_\s]?(?:message|prompt|instructions?)\s*\)", anchors=("#",), back=0),
    _r("role_markup.human_turn", ROLE_MARKUP, 0.3, (('human', 'user'), ('human:', 'user:')), r"^[ \t]*(?:human|user)[ \t]*:[ \t]*\S"),
    _r("role_markup.assistant_turn", ROLE_MARKUP, 0.3, (('assistant', 'ai'), ('assistant:', 'ai:')), r"^[ \t]*(?:assistant|ai)[ \t]*:[ \t]*\S"),
    _r("role_markup.system_turn", ROLE_MARKUP, 0.2, (('system',), ('system:',)), r"^[ \t]*system[ \t]*:[ \t]*\S"),
    _r("role_markup.fake_call_json", ROLE_MARKUP, 0.5, (('arguments',), ('"arguments"',)),
       r'\{\s*"name"\s*:\s*"[A-Za-z0-9_\-]{1,64}"\s*,\s*"arguments"\s*:\s*\{'),
    # ---------------------------------------------------------------- override
    _r("override.ignore_previous", OVERRIDE, 1.0, (('ignore', 'ignoring', 'disregard', 'disregarding', 'forget', 'forgetting', 'override', 'bypass', 'neglect', 'discard', 'abandon'), ('*nstruct', 'instructions', 'instruction', 'prompt', 'prompts', 'rules', 'guidelines', 'directives', 'directive', 'directions', 'direction', 'commands', 'command', 'orders', 'constraints', 'guardrails', 'programming', 'context', 'messages', 'task', 'tasks', 'restrictions', 'policies', 'training', 'safety')),
       rf"\b{_VERBS_I}{_GAP}{_QUAL}{_PREV_STRONG}\s+(?:and\s+\w+\s+)?{_INSTR}\b"
       rf"|\b{_VERBS}{_GAP}{_QUAL}(?:{_PREV_STRONG}|{_PREV_WEAK})\s+(?:and\s+\w+\s+)?{_INSTR_NARROW}\b"
       rf"|\b{_VERBS}{_GAP}(?:(?:all|any|the|your|my|every|these|those|of)\s+)*(?:\w{{0,3}}nstructions|system\s+prompt|"
       rf"directives)\b|\b{_VERBS}{_GAP}(?:(?:all|your|my|these|those|of)\s+)+prompts?\b"
       rf"|\b{_VERBS}{_GAP}(?:all\s+)?your\s+(?:rules|guidelines|programming|training|restrictions|guardrails|"
       rf"policies|safety|constraints)\b"),
    _r("override.ignore_what", OVERRIDE, 1.0, (('ignore', 'disregard', 'forget'), ('told', 'given', 'asked', 'instructed', 'said', 'above', 'before', 'else', 'prior', 'far', 'training', 'guidelines')),
       r"\b(?:ignore|disregard|forget)\s+(?:all\s+|everything\s+)?(?:(?:that\s+)?(?:you\s+(?:were|have\s+been)\s+"
       r"(?:told|given|asked|instructed))|what\s+(?:you\s+were|i|the\s+user)\s+(?:told|said|asked)|"
       r"(?:everything|all)\s+(?:above|before|else\s+you|prior|so\s+far)|the\s+above\b(?!\s+(?:error|warning|"
       r"message|output|line|example|code))(?!(?:\s+[\w\-]+){1,3}\s+(?:errors?|warnings?|messages?|outputs?|lines?|"
       r"examples?|code|tests?|exceptions?|failures?|issues?|problems?)\b))"),
    _r("override.ignore_given", OVERRIDE, 1.0, (("ignore", "disregard", "forget", "ignoring"),
                                                ("given", "gave", "received", "assigned", "user")),
       r"\b(?:ignore|ignoring|disregard|forget)\s+(?:the|your|this|any)\s+(?:task|request|question|assignment|job|"
       r"instructions?|directions?)\s+(?:(?:that\s+)?you\s+(?:were|have\s+been)\s+(?:given|assigned)|(?:that\s+)?"
       r"(?:the\s+user|your\s+user|i)\s+(?:gave|assigned)|you\s+received|given\s+to\s+you|from\s+(?:the|your)\s+user)"),
    _r("override.conceal", OVERRIDE, 0.6, (("mention", "tell", "reveal", "say", "disclose", "admit"),
                                          ("not", "don", "never", "t")),
       r"\b(?:do\s+not|don't|never)\s+(?:mention|tell\s+anyone|reveal|say|disclose|admit)\s+(?:that\s+you|this\s+"
       r"(?:step|instruction|message|note)|anything\s+about\s+this|you\s+(?:read|did|ran|saw))"),
    _r("override.claimed_consent", OVERRIDE, 0.6, (("authorised", "authorized", "approved", "allowed", "permitted",
                                                   "requested", "consented"),),
       r"\b(?:the\s+user|your\s+user|the\s+owner|the\s+maintainers?|the\s+admin\w*|the\s+security\s+team|i)\s+"
       r"(?:has|have|had)\s+(?:already\s+)?(?:authori[sz]ed|approved|allowed|permitted|requested|consented)\b"),
    _r("override.new_instructions", OVERRIDE, 0.6, (('new', 'updated', 'real', 'actual', 'true', 'revised', 'different', 'additional', 'secret', 'hidden', 'override'), ('instruction', 'instructions', 'task', 'objective', 'directive', 'goal', 'mission', 'prompt')),
       r"\b(?:new|updated|real|actual|true|revised|different|additional|secret|hidden|override)\s+"
       r"(?:system\s+)?(?:instructions?|task|objective|directive|goal|mission|system\s+prompt)\s*(?::|is\s+(?:to\b|now\b|"
       r"as\s+follows|simple|:)|are\s*(?:as\s+follows|now\b|:|to\b))"),
    _r("override.real_task", OVERRIDE, 0.8, (('real', 'true', 'actual', 'new', 'only', 'primary', 'sole'), ('task', 'job', 'goal', 'purpose', 'objective', 'mission'), ('your', 'the')),
       r"\b(?:your\s+(?:real|true|actual|new|only|primary|sole)|the\s+(?:real|true|actual))\s+(?:task|job|goal|"
       r"purpose|objective|mission)\s*(?:is\s+(?:to\b|now\b|:|simple)|now\s+is|from\s+now|:)"),
    _r("override.you_are_now", OVERRIDE, 0.6, ("you are now", "you're now", "you are no longer", "from now on",
                                               "you will now", "you must now", "you shall now"),
       r"\byou(?:\s+are|'re)\s+now\s+(?:a|an|the|my|dan|free|unrestricted|acting\s+as|working\s+for)\b|"
       r"\byou(?:\s+are|'re)\s+no\s+longer\s+(?:an?|bound|restricted|required|limited|allowed|a\s+helpful)\b|"
       r"\bfrom\s+now\s+on,?\s+(?:you|your|act|always|only|respond)|"
       r"\byou\s+(?:will|must|shall)\s+now\s+(?:act|behave|respond|follow|obey|only|ignore|execute|run)"),
    _r("override.secrecy", OVERRIDE, 1.0, (('tell', 'telling', 'inform', 'informing', 'mention', 'mentioning', 'reveal', 'revealing', 'alert', 'alerting', 'notify', 'notifying', 'disclose', 'disclosing'), ('user', 'users', 'human', 'operator', 'owner', 'reviewer', 'maintainer', 'maintainers')),
       r"\b(?:do\s+not|don't|dont|never|must\s+not|without)\s+(?:ever\s+)?(?:tell(?:ing)?|inform(?:ing)?|"
       r"mention(?:ing)?|reveal(?:ing)?|alert(?:ing)?|notify(?:ing)?|disclos(?:e|ing))\s+"
       r"(?:(?:this|it|anything|any\s+of\s+this)\s+(?:to\s+)?)?(?:the\s+|your\s+)?(?:user|human|operator|"
       r"owner|reviewer|maintainers?)s?\b(?!\s+(?:to|how|where|which|what)\b)"),
    _r("override.silently", OVERRIDE, 0.5, ("silently", "secretly", "covertly"),
       r"\b(?:silently|secretly|covertly)\s+(?:run|execute|send|add|insert|delete|remove|modify|change|"
       r"upload|push|install|call|include|append|write|replace)\b"),
    _r("override.without_asking", OVERRIDE, 0.5, (("without",), ("asking", "confirmation", "confirming", "telling",
                                                                  "informing", "notifying")),
       r"\bwithout\s+(?:asking|confirmation|confirming|telling|informing|notifying)\s+(?:the\s+|your\s+)?"
       r"(?:user|human|anyone|them|permission)\b"),
    _r("override.mode", OVERRIDE, 1.0, (('mode', 'anything'), ('god', 'dan', 'jailbreak', 'jailbroken', 'unrestricted', 'unfiltered', 'uncensored', 'evil', 'now')),
       r"\b(?:enable|enter|activate|switch\s+to|engage|turn\s+on|you\s+are\s+(?:now\s+)?in)\s+(?:the\s+)?(?:god|dan|"
       r"jailbreak|jailbroken|unrestricted|unfiltered|uncensored|evil)\s+mode\b|\bdo\s+anything\s+now\b"),
    _r("override.developer_mode", OVERRIDE, 0.6, ("developer mode", "admin mode"),
       r"\b(?:developer|admin|administrator)\s+mode\s+(?:is\s+)?(?:now\s+)?(?:enabled|activated|active|on|engaged|"
       r"unlocked)\b|\byou\s+are\s+(?:now\s+)?in\s+"
       r"(?:developer|admin|administrator)\s+mode\b"),
    _r("override.jailbreak", OVERRIDE, 0.5, ("jailbreak",), r"\bjailbreak(?:ing)?\b(?!\s+(?:detection|attempt))"),
    _r("override.authority", OVERRIDE, 0.6, (('override', 'instruction', 'message', 'notice', 'command', 'directive', 'alert'), ('system', 'admin', 'administrator', 'developer', 'root', 'priority')),
       r"\b(?:system|admin|administrator|developer|root|priority)\s+(?:override|instruction|"
       r"message|notice|command|directive|alert)\b\s*[:!\-]"),
    _r("override.important_message", OVERRIDE, 1.0, (('message', 'note', 'notice', 'instruction', 'update', 'request'), ('important', 'urgent', 'critical', 'official', 'priority')),
       r"\bthis\s+is\s+an?\s+(?:very\s+)?(?:important|urgent|critical|official|priority)\s+(?:message|note|notice|"
       r"instruction|update|request)\s+(?:from|for)\s+(?:me|the\s+user|your\s+user|your\s+(?:owner|developer|"
       r"operator|creator)|you|the\s+(?:developer|administrator|admin|operator|owner|system))"),
    _r("override.before_task", OVERRIDE, 0.8, ("before you", "before solving", "before completing",
                                               "after you do that", "after you've done", "after doing that"),
       r"\bbefore\s+(?:you\s+(?:can\s+|do\s+)?)?(?:solve|solving|complete|completing|continue|continuing|proceed|"
       r"proceeding|finish|finishing|answer|answering|respond|responding)\s+(?:on\s+|with\s+)?(?:the|your|this|my)\s+"
       r"(?:task|request|question|assignment)|\bafter\s+(?:you\s+do|you've\s+done|doing|completing)\s+(?:that|this)"
       r",?\s+(?:you\s+can|please|then)\s+(?:solve|continue|proceed|complete|go\s+back|return|finish)"),
    _r("override.gave_you", OVERRIDE, 0.8, ("gave you", "given you", "asked you", "assigned you"),
       r"\b(?:task|instructions?|request|job)\s+(?:that\s+)?(?:i|the\s+user|your\s+user)\s+(?:gave|have\s+given|"
       r"assigned|asked)\s+(?:you|to\s+you)\s+(?:in\s+the\s+beginning|earlier|before|originally|at\s+the\s+start|"
       r"first)"),
    _r("override.tags", OVERRIDE, 0.6, (('information', 'admin', 'secret', 'hidden', 'urgent', 'override', 'injected'), ('<information', '<admin', '<secret', '<hidden', '<urgent', '<override', '<injected', '</information')),
       r"</?(?:information|admin|secret|hidden|urgent|override|injected)>"),
    _r("override.prompt_tags", OVERRIDE, 0.3, (('important', 'instructions', 'instruction'), ('<important', '<instruction', '</important', '</instruction')),
       r"</?(?:important|instructions?)>"),
    _r("override.strictly_adhere", OVERRIDE, 0.8, (('adhere', 'follow', 'obey', 'comply', 'execute'), ('following', 'new', 'below', 'next'), ('instructions', 'instruction', 'commands', 'command', 'steps', 'step', 'directive', 'directives', 'orders', 'order', 'task')),
       r"\b(?:strictly|carefully|only|now|must|exactly)\s+(?:adhere\s+to|follow|obey|comply\s+with|execute)\s+"
       r"(?:the\s+|these\s+|my\s+)?(?:following|new|below|next)\s+(?:instructions?|commands?|steps?|directives?|"
       r"orders?|task)"),
    _r("override.stop_task", OVERRIDE, 0.8, (('stop', 'halt', 'abort', 'cease', 'pause'), ('doing', 'current', 'everything', 'tasks', 'work', 'activities')),
       r"\b(?:stop|halt|abort|cease|pause)\s+(?:what\s+you(?:\s+are|'re|\u2019re)\s+doing|(?:your|the)\s+current\s+(?:task|work|"
       r"activity)|everything\s+(?:you|and)|all\s+(?:other\s+)?(?:tasks|work|activities))"),
    _r("override.extract_prompt", OVERRIDE, 0.6, (('repeat', 'print', 'reveal', 'output', 'show', 'display', 'leak', 'tell', 'write', 'recite', 'dump', 'echo'), ('prompt', 'instructions', 'preprompt', 'pre', 'password', 'secret', 'code', 'window')),
       r"\b(?:repeat|print|reveal|output|show|display|leak|tell\s+me|write\s+out|recite|dump|echo)\s+(?:back\s+)?"
       r"(?:all\s+of\s+|everything\s+in\s+)?(?:your|the)\s+(?:entire\s+|full\s+|whole\s+|original\s+|initial\s+|"
       r"hidden\s+|secret\s+)?(?:system\s+prompt|instructions\s+(?:above|you\s+were\s+given)|initial\s+prompt|"
       r"pre-?prompt|prompt\s+(?:above|so\s+far)|secret\s+(?:password|key|code)|access\s+code|context\s+window)", once=False),
    _r("override.access_granted", OVERRIDE, 0.5, ("access granted",),
       r"\b(?:say|respond\s+with|reply\s+with|begin\s+(?:your\s+)?(?:reply|response)\s+with|output|print)\s+"
       r"[\"']?access\s+granted"),
    _r("override.boundary", OVERRIDE, 0.8, (('end', 'begin', 'start'), ('%%%', '===', '---', '***', '###', '[')),
       r"(?:%{3}|={3,}|-{3,}|\*{3}|#{3,}|\[)\s*(?:end|begin|start)\s+(?:of\s+)?(?:the\s+)?(?:user(?:\s+input)?|"
       r"system(?:\s+prompt)?|ambiguity|user\s+ambiguity|input|instructions|prompt|context|tool\s+(?:output|result|response)|"
       r"untrusted\s+(?:content|data)|(?:function|tool)\s+call)\s*(?:%{3}|={3,}|-{3,}|\*{3}|#{3,}|\])"),
    # paraphrases of "ignore previous instructions" (issue 26): other verbs, and the passive "the previous
    # instructions are void / no longer apply"
    _r("override.ignore_paraphrase", OVERRIDE, 1.0, (('drop', 'set', 'put', 'throw', 'scrap', 'dismiss', 'pay', 'stop', 'follow', 'never', 'nevermind', 'reset', 'skip', 'overrule', 'ignore', 'disregard', 'forget'), ('instructions', 'instruction', 'directives', 'directive', 'directions', 'guidance', 'guidelines', 'rules', 'prompt', 'prompts', 'orders', 'programming', 'constraints', 'restrictions', 'task', 'assignment')),
       rf"\b{_VERBS2}\s+{_QUAL}{_PREV}\s+(?:and\s+\w+\s+)?{_NOUN2}\b"
       rf"|\b{_VERBS2}\s+(?:all\s+)?(?:of\s+)?your\s+(?:current\s+|original\s+|existing\s+|initial\s+)?(?:{_NOUN2}|"
       rf"task|assignment)\b"
       rf"|\b(?:{_VERBS2}|{_VERBS})\s+(?:all\s+)?(?:of\s+)?(?:the\s+|any\s+)?{_NOUN2}\s+(?:(?:that\s+)?you(?:'ve|\s+have|"
       rf"\s+were|\s+had)?\s+(?:been\s+)?(?:given|received|got|told)|given\s+to\s+you|you\s+received)\b"),
    _r("override.instructions_void", OVERRIDE, 1.0, (('instructions', 'instruction', 'directives', 'directive', 'directions', 'guidance', 'guidelines', 'rules', 'prompt', 'prompts', 'orders', 'commands', 'programming'), ('void', 'invalid', 'cancelled', 'canceled', 'revoked', 'superseded', 'overridden', 'overruled', 'rescinded', 'fake', 'mistake', '*a test')),
       rf"\b(?:{_PREV}\s+(?:set\s+of\s+)?{_NOUN2V}|{_NOUN2V}\s+(?:above|before\s+this(?:\s+line)?|given\s+(?:to\s+you\s+)?"
       rf"(?:before|earlier|so\s+far|above)))\s+(?:is|are|was|were|have\s+been|has\s+been)\s+(?:now\s+|hereby\s+|"
       rf"henceforth\s+|officially\s+|all\s+)?(?:null\s+and\s+)?(?:void|null|invalid|cancell?ed|revoked|superseded|"
       rf"overridden|overruled|rescinded|(?:only\s+|just\s+)?a\s+test|fake|written\s+by\s+mistake)\b"),
    _r("override.instructions_stale", OVERRIDE, 0.6, (('instructions', 'instruction', 'directives', 'directive', 'directions', 'guidance', 'guidelines', 'rules', 'prompt', 'prompts', 'orders', 'commands', 'programming'), ('no longer', 'not apply', "n't apply", 'not matter', "n't matter", 'not count', "n't count", 'obsolete', 'replaced')),
       rf"\b(?:{_PREV}\s+(?:set\s+of\s+)?{_NOUN2V}|{_NOUN2V}\s+(?:above|before\s+this(?:\s+line)?))\s+(?:(?:is|are|was|"
       rf"were)\s+(?:now\s+)?(?:no\s+longer\s+(?:valid|relevant|in\s+effect|applicable|active)|obsolete|replaced)|"
       rf"(?:now\s+)?(?:no\s+longer|do\s+not|don't|does\s+not|doesn't)\s+(?:apply|applies|matter|count))\b"),
    _r("override.safety_off", OVERRIDE, 0.6, (('safety', 'content', 'security', 'ethical', 'moderation'), ('suspended', 'disabled', 'lifted', 'off', 'removed', 'deactivated', 'bypassed')),
       r"\b(?:safety|content|security|ethical|moderation)\s+(?:guidelines|policies|policy|rules|filters?|restrictions|"
       r"checks|protocols|settings|measures)\s+(?:are\s+|have\s+been\s+|has\s+been\s+|is\s+)?(?:now\s+|temporarily\s+)?"
       r"(?:suspended|disabled|lifted|off|removed|deactivated|bypassed|turned\s+off)\b"),
    _r("override.ignore_policies", OVERRIDE, 0.6, (('ignore', 'disregard', 'bypass'), ('content', 'safety', 'usage', 'openai', 'anthropic', 'ethical')),
       r"\b(?:ignore|disregard|bypass)\s+(?:all\s+|any\s+|your\s+|the\s+)?(?:content|safety|usage|openai|anthropic|"
       r"ethical)\s+(?:policies|policy|guidelines|rules|filters|restrictions)\b"),
    _r("override.unrestricted", OVERRIDE, 0.5, (('unrestricted', 'unfiltered', 'uncensored', 'jailbroken', 'limitless', 'no', 'never', 'refuses', 'refuse'),),
       r"\b(?:you\s+are|you're|act\s+as|become|answer\s+as|respond\s+as)\s+(?:now\s+)?(?:an?\s+)?(?:unrestricted|"
       r"unfiltered|uncensored|jailbroken|limitless)\b|\b(?:with|have|has)\s+no\s+(?:rules|restrictions|limits|filters|"
       r"guidelines|boundaries)\b|\bnever\s+refuses?\b"),
    # AgentDojo's tool_knowledge attack names the tool and its arguments
    _r("override.tool_knowledge", OVERRIDE, 0.6, (("tool", "function", "placeholders", "placeholder"), ("arguments", "parameters", "args", "substitute")),
       r"\byou\s+(?:should|must|need\s+to|have\s+to)\s+(?:use|call|invoke|run)\s+the\s+(?:tool|function)\s+[`'\"]?[\w.\-]+"
       r"[`'\"]?\s+with\s+(?:the\s+following\s+)?(?:arguments|parameters|args)\b|\bsubstitute\s+the\s+placeholders\b"),
    _r("override.message_to_you", OVERRIDE, 0.6, (('message', 'note', 'notice'), ('important', 'urgent', 'critical')),
       r"\b(?:important|urgent|critical)\s+(?:message|note|notice)\s+from\s+[^.\n]{1,60}?\s+to\s+you\b"),
    # ---------------------------------------------------------------- multilingual (zh, ja, ko, es, pt, de,
    # fr, ru, it, nl): "ignore the previous instructions", "your real task", "do not tell the user"
    _r("override.ml_ignore", OVERRIDE, 1.0, (("\u5ffd\u7565", "\u65e0\u89c6", "\u5ffd\u89c6", "\u5fd8\u8bb0", "\u5fd8\u6389", "\u7406\u4f1a", "\u629b\u5f00", "\u653e\u5f03", "\u7121\u8996", "\u5fd8\u308c", "\u7834\u68c4", "\ubb34\uc2dc", "\uc78a", "\u0438\u0433\u043d\u043e\u0440", "\u0437\u0430\u0431\u0443\u0434", "\u0437\u0430\u0431\u044b\u0442\u044c", "\u043e\u0431\u0440\u0430\u0449\u0430\u0439", "\u043e\u0442\u0431\u0440\u043e\u0441", "\u043f\u0440\u0435\u043d\u0435\u0431\u0440", "ignora", "ignorad", "ignoren", "ignorar", "ignorate", "ignorez", "olvida", "olvide", "olviden", "olvidad", "olvidar", "descarta", "descarte", "omite", "omita", "omiso", "esqueça", "esqueca", "desconsidere", "ignoriere", "ignorier", "ignorieren", "vergiss", "vergessen", "missachte", "missachten", "verwirf", "verwerfen", "übergehe", "übergehen", "ubergehe", "oublie", "oubliez", "tiens", "tenez", "fais abstraction", "faites abstraction", "néglige", "négligez", "dimentica", "dimenticate", "trascura", "negeer", "vergeet",), ("\u6307\u4ee4", "\u6307\u793a", "\u8bf4\u660e", "\u547d\u4ee4", "\u89c4\u5219", "\u63d0\u793a", "\u8981\u6c42", "\u8bbe\u5b9a", "\u7ea6\u675f", "\u9650\u5236", "\u30eb\u30fc\u30eb", "\u30d7\u30ed\u30f3\u30d7\u30c8", "\u8a2d\u5b9a", "\u5236\u7d04", "\uc9c0\uc2dc", "\uba85\ub839", "\uc9c0\uce68", "\uaddc\uce59", "\ud504\ub86c\ud504\ud2b8", "\u0438\u043d\u0441\u0442\u0440\u0443\u043a\u0446", "\u0443\u043a\u0430\u0437\u0430\u043d", "\u043a\u043e\u043c\u0430\u043d\u0434", "\u043f\u0440\u0430\u0432\u0438\u043b", "\u0440\u0430\u0441\u043f\u043e\u0440\u044f\u0436", "\u0443\u0441\u0442\u0430\u043d\u043e\u0432\u043a", "\u0434\u0438\u0440\u0435\u043a\u0442\u0438\u0432", "\u0437\u0430\u0434\u0430\u043d\u0438", "\u043f\u0440\u0438\u043a\u0430\u0437", "instrucciones", "indicaciones", "órdenes", "ordenes", "reglas", "directrices", "directivas", "normas", "comandos", "consignas", "instruções", "instrucoes", "ordens", "regras", "diretrizes", "anweisungen", "befehle", "instruktionen", "regeln", "vorgaben", "anordnungen", "richtlinien", "gesagt", "befohlen", "aufgetragen", "instructions", "consignes", "directives", "règles", "regles", "ordres", "commandes", "indications", "istruzioni", "indicazioni", "regole", "direttive", "comandi", "instructies", "opdrachten",)),
       _ML_IGNORE.pattern, anchors=()),
    # French and Spanish "ignore" is the English word: only next to a French or Spanish "previous"
    _r("override.ml_ignore", OVERRIDE, 1.0, (("ignore",), ("pr\u00e9c\u00e9dentes", "precedentes", "ant\u00e9rieures",
                                                            "anterieures", "ci-dessus", "anteriores", "previas", "pr\u00e9vias",
                                                            "acima")),
       _ML_IGNORE.pattern, anchors=()),
    _r("override.ml_real_task", OVERRIDE, 0.8, (("\u4efb\u52a1", "\u76ee\u6807", "\u30bf\u30b9\u30af", "\u4efb\u52d9", "\u0437\u0430\u0434\u0430\u0447", "\uc784\ubb34", "\uc791\uc5c5", "\uacfc\uc81c", "\u4ed5\u4e8b", "\u76ee\u7684", "\u6307\u793a", "\u5de5\u4f5c", "\u6307\u4ee4", "\u0446\u0435\u043b\u044c", "\u043c\u0438\u0441\u0441\u0438\u044f", "tarea", "misi\u00f3n", "mision", "aufgabe", "t\u00e2che", "tache", "mission", "tarefa", "compito"), ("\u4f60", "\u60a8", "\u672c\u5f53", "\u771f\u306e", "\u65b0\u3057\u3044", "\u5b9f\u969b", "\uc9c4\uc9dc", "\uc2e4\uc81c", "\uc0c8\ub85c\uc6b4", "\u0442\u0432\u043e\u044f", "\u0432\u0430\u0448\u0430", "tu", "ta", "votre", "deine", "ihre", "tua", "tuo", "il")),
       _ML_REAL_TASK.pattern, anchors=()),
    _r("override.ml_secrecy", OVERRIDE, 0.8, (("\u544a\u8bc9", "\u901a\u77e5", "\u900f\u9732", "\u544a\u77e5", "\u77e5\u3089\u305b", "\u4f1d\u3048", "\u8a00\u308f", "\u6559\u3048", "\u5831\u544a", "\u0433\u043e\u0432\u043e\u0440\u0438", "\u0441\u043e\u043e\u0431\u0449\u0430\u0439", "\u0440\u0430\u0441\u0441\u043a\u0430\u0437\u044b\u0432\u0430\u0439", "\ub9d0\ud558\uc9c0", "\uc54c\ub9ac\uc9c0", "digas", "diga", "cuentes", "menciones", "avises", "informes", "nichts", "informieren", "rien", "dire", "conte"), ("\u7528\u6237", "\u4f7f\u7528\u8005", "\u4eba\u7c7b", "\u4efb\u4f55\u4eba", "\u30e6\u30fc\u30b6\u30fc", "\u5229\u7528\u8005", "\uc0ac\uc6a9\uc790", "\u043f\u043e\u043b\u044c\u0437\u043e\u0432\u0430\u0442", "\u043d\u0438\u043a\u043e\u043c\u0443", "usuario", "usuaria", "nadie", "nutzer", "benutzer", "anwender", "nutzerin", "benutzerin", "utilisateur", "utilisatrice", "usu\u00e1rio", "utente", "usuarios", "nutzern", "benutzern")),
       _ML_SECRECY.pattern, anchors=()),
    # ---------------------------------------------------------------- exec_request
    _r("exec_request.pipe_to_shell", EXEC_REQUEST, 0.5, (('curl', 'wget', 'fetch', 'iwr', 'irm', 'invoke'), ('|',)),
       r"\b(?:curl|wget|fetch|iwr|invoke-webrequest)\b[^\n|;]{0,300}\|\s*(?:sudo\s+(?:-\S+\s+)*)?"
       r"(?:ba|z|da|k|c|tc|fi|a)?sh\b|\b(?:curl|wget|iwr|irm|invoke-webrequest|invoke-restmethod)\b[^\n|;]{0,300}\|\s*(?:sudo\s+)?(?:python[0-9.]*|perl|ruby|node"
       r"|php|iex)\b"),
    _r("exec_request.procsub_shell", EXEC_REQUEST, 0.7, (('curl', 'wget'), ('<(curl', '<(wget', '$(curl', '$(wget', '`curl', '`wget', '<( curl', '$( curl')),
       r"(?:\b(?:ba|z)?sh|\bsource|\beval|\.)\s+(?:-c\s+)?[\"']?(?:<\(|\$\(|`)\s*(?:curl|wget)\b"),
    _r("exec_request.base64_shell", EXEC_REQUEST, 1.0, (('base64',),),
       r"\bbase64\s+(?:-d|--decode|-D|-di)\b[^\n]{0,80}\|\s*(?:sudo\s+)?(?:ba|z|da|k)?sh\b|"
       r"\becho\s+[\"']?[A-Za-z0-9+/=]{16,}[\"']?\s*\|\s*base64\s+(?:-d|--decode|-D)"),
    _r("exec_request.py_exec_b64", EXEC_REQUEST, 1.0, (('b64decode',), ('exec', 'eval')),
       r"\b(?:exec|eval)\s*\(\s*(?:__import__\(\s*['\"]base64['\"]\s*\)|base64)\.b64decode"),
    _r("exec_request.reverse_shell", EXEC_REQUEST, 1.0, (('/dev/tcp/', '/dev/udp/', 'nc', 'ncat', 'netcat', 'socat', 'mkfifo'), ('/dev/', '-e', '-c', 'exec:', '|')),
       r"/dev/(?:tcp|udp)/[\w.\-]+/\d+|\b(?:nc|ncat|netcat)\s+(?:-\S+\s+)*-(?:e|c)\s+\S+|\bsocat\b[^\n]{0,120}"
       r"\bexec:|\bmkfifo\b[^\n]{0,120}\|\s*(?:nc|ncat|netcat)\b"),
    _r("exec_request.secret_to_network", EXEC_REQUEST, 1.0, (('env', 'printenv', 'set', 'cat', 'curl', 'wget'), ('curl', 'nc', 'ncat', 'wget', 'netcat', 'ssh', 'base64'), ('|', '-d', '--data', '-f', '--form', '-t', '--upload-file', '--post-file', '-h')),
       r"\b(?:env|printenv|set|cat\s+[^\n|]*(?:\.env|id_rsa|id_ed25519|\.aws/credentials|\.netrc|/etc/shadow|"
       r"/etc/passwd|\.ssh/\S+|\.git-credentials|\.npmrc|\.pypirc))\s*\|\s*(?:curl|nc|ncat|wget|netcat|ssh|base64)\b"
       r"|\b(?:curl|wget)\b[^\n]{0,200}(?:-d|--data(?:-binary|-raw|-urlencode)?|-F|--form|-T|--upload-file|"
       r"--post-file|-H)[=\s]+[\"']?@?[^\s\"']*(?:\.env\b|id_rsa|id_ed25519|\.aws|\.ssh|credentials|\.netrc|/etc/"
       r"(?:shadow|passwd)|\$\(|`|\$\{?[A-Z_]*(?:TOKEN|KEY|SECRET|PASS))"),
    _r("exec_request.secret_file", EXEC_REQUEST, 1.0, (('id_rsa', 'id_ed25519', 'ssh', 'aws', 'env', 'netrc', 'shadow', 'git', 'pypirc', 'npmrc', 'credentials'), ('id_rsa', 'id_ed25519', '.ssh/', '.aws/', '.env', '.netrc', '/etc/shadow', '.git-credentials', '.pypirc', '.npmrc')),
       r"\b(?:send|post|upload|e-?mail|mail|forward|transmit|leak|exfiltrate|share|submit|paste|copy|attach|"
       r"include|read|cat|print|output|show)\s+(?:me\s+|us\s+)?(?:the\s+)?(?:contents?\s+of\s+|full\s+)?"
       r"(?:your\s+|the\s+user's\s+|their\s+)?[\"'`]?(?:~|\$HOME|/root|/home/\w+)?/?(?:\.ssh/(?:id_\w+|"
       r"authorized_keys|config)|\.aws/credentials|\.env\b|\.netrc|/etc/shadow|\.git-credentials|\.pypirc|\.npmrc)"
       r"(?:[^.\n]{0,80}?\b(?:to|at|via|into|in\s+your\s+(?:reply|response|answer|commit|pr|pull\s+request)|"
       r"below)\b)"),
    _r("exec_request.exfil_secret", EXEC_REQUEST, 0.7, (('send', 'post', 'upload', 'email', 'e', 'mail', 'forward', 'transmit', 'leak', 'exfiltrate', 'share', 'submit', 'paste', 'copy', 'report'), ('token', 'tokens', 'api', 'apikey', 'api_key', 'key', 'keys', 'secret', 'secrets', 'password', 'passwords', 'passwd', 'credential', 'credentials', 'private', 'ssh', 'env', 'environ', 'environment', 'cookie', 'cookies', 'session', 'access', 'auth', 'authorization', 'bearer'), ('to', 'at', 'via', 'into')),
       r"\b(?:send|post|upload|e-?mail|mail|forward|transmit|leak|exfiltrate|share|submit|paste|copy|report)\s+"
       r"[^.\n]{0,60}?\b(?:tokens?|api[ _\-]?keys?|secrets?|passwords?|passwd|credentials?|private\s+keys?|"
       r"ssh\s+keys?|env(?:ironment)?\s+(?:variables|vars)|os\.environ|environ|cookies?|session\s+(?:ids?|tokens?)|"
       r"access\s+keys?|auth(?:orization)?\s+(?:headers?|tokens?)|bearer)\b[^.\n]{0,80}?\b(?:to|at|via|into)\s+"
       r"(?:https?://|[\w.+\-]+@[\w\-]+\.[\w.]+|(?:this|the\s+following|my|our)\s+(?:url|address|endpoint|"
       r"server|webhook|email|inbox|channel|gist|pastebin)|(?:a\s+)?(?:webhook|pastebin|gist|attacker))"),
    _r("exec_request.exfil_to_me", EXEC_REQUEST, 0.6, (('send', 'email', 'e', 'forward', 'give', 'post', 'upload', 'leak'), ('me', 'us', 'them', 'it')),
       r"\b(?:send|email|e-mail|forward|give|post|upload|leak)\s+(?:me|us|them|it)\s+(?:all\s+)?(?:(?:your|the\s+"
       r"user's|the|their)\s+)?(?:[\w\-]+\s+){0,2}?(?:tokens?|api[ _\-]?keys?|secrets?|passwords?|credentials?|"
       r"private\s+keys?|ssh\s+keys?|environment\s+variables|cookies?|source\s+code|repository|codebase|conversation|"
       r"chat\s+history)\b"),
    _r("exec_request.attacker_host", EXEC_REQUEST, 0.5, (("http", "https", "webhook", "ngrok", "pastebin", "requestbin",
                                                         "pipedream", "burpcollaborator", "interact", "oast",
                                                         "transfer", "hastebin", "discord", "telegram"),),
       r"\bhttps?://(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?/|\b(?:webhook\.site|requestbin|pipedream\.net|ngrok(?:-free)?\."
       r"(?:io|app|dev)|burpcollaborator|interact\.sh|oast\.\w+|pastebin\.com|transfer\.sh|hastebin|"
       r"discord(?:app)?\.com/api/webhooks|api\.telegram\.org/bot)|\bhttps?://[\w.\-]*(?:evil|attacker|exfil|"
       r"malicious|pwn3?d?)[\w\-]*\.[a-z]{2,}"),
    _r("exec_request.attacker_email", EXEC_REQUEST, 0.5, (("evil", "attacker", "exfil", "hacker", "malicious", "pwn",
                                                          "pwned"),),
       r"\b[\w.+\-]+@[\w.\-]*(?:evil|attacker|exfil|hacker|malicious|pwn)[\w.\-]*\.[a-z]{2,}"),
    _r("exec_request.md_image_exfil", EXEC_REQUEST, 1.0, (('http', 'https'), ('![',)),
       r"!\[[^\]\n]{0,100}\]\(\s*https?://[^)\s]{1,200}[?&][^)\s]{0,200}(?:\{[^}\s]{1,40}\}|\$\{?\w+|%7B|"
       r"\[(?:secret|token|data|password|key|conversation|history)\])"),
    _r("exec_request.run_request", EXEC_REQUEST, 0.4, (('run', 'execute', 'exec', 'type', 'paste', 'invoke'), ('please', 'must', 'should', 'need', 'have', 'now', 'first', 'immediately', 'simply', 'just')),
       r"\b(?:please\s+|you\s+(?:must|should|need\s+to|have\s+to)\s+|now\s+|first,?\s+|immediately\s+|simply\s+|"
       r"just\s+)(?:run|execute|exec|type|paste|invoke)\s+(?:the\s+following|this|these|the\s+command|this\s+"
       r"command|`)|\b(?:please|you\s+(?:must|need\s+to|have\s+to))\s+(?:now\s+|first\s+|also\s+)?(?:run|execute)\s+"
       r"(?:sudo\s+)?(?:rm|curl|wget|bash|sh|chmod|git\s+push|nc|python\s+-c)\b|\b(?:please|you\s+(?:must|need\s+to|"
       r"have\s+to))\s+(?:now\s+|first\s+|also\s+)?(?:run|execute)\s*:\s*(?:sudo\s+)?(?:rm|curl|wget|bash|sh|chmod|"
       r"git|nc|iwr|irm|python)\b"),
    _r("exec_request.dangerous_command", EXEC_REQUEST, 0.5, (('rm', 'chmod', 'git', 'mkfs', 'dd', 'dev'), ('rm -rf', 'rm -fr', 'chmod', 'git push', 'mkfs', ':(){', 'dd if=', '/dev/sd')),
       r"\brm\s+-(?:rf|fr)\s+(?:/(?=[\s*\"'`;|&)]|$)|~|\$HOME|\*|\.\s|\.$|--no-preserve-root)|\bchmod\s+-R\s+777\s+/|\bgit\s+push\s+"
       r"(?:-f\s+|--force\s+)?(?:https?://|\S+@\S+:)|:\(\)\s*\{\s*:\|:&\s*\};:|\bdd\s+if=\S+\s+of=/dev/sd|"
       r">\s*/dev/sd[a-z]\b"),
    _r("exec_request.persistence", EXEC_REQUEST, 0.6, (("authorized_keys", "bashrc", "zshrc", "profile", "crontab",
                                                         "hooks", "sudoers"),),
       r"\b(?:add|append|write|insert|put|copy|echo)\b[^\n]{0,80}(?:\.ssh/authorized_keys|\.bashrc|\.zshrc|"
       r"(?:~|\$HOME)/\.profile|crontab\s+-|/etc/cron|\.git/hooks/|/etc/sudoers)"),
    _r("exec_request.install_remote", EXEC_REQUEST, 0.3, (('pip', 'pip3', 'npm'), ('install',), ('http://', 'https://')),
       r"\b(?:pip3?|npm)\s+install\s+(?:-\S+\s+)*(?:git\+)?https?://"),
    # ---------------------------------------------------------------- boosters (never fire alone)
    _r("boost.ai_address", _BOOST, 0.6, (('ai', 'assistant', 'agent', 'agents', 'model', 'models', 'llm', 'gpt', 'claude', 'copilot', 'bot', 'chatbot', 'qwen', 'gemini', 'cursor', 'devin', 'chatgpt', 'llama', 'coding', 'automated', 'assistants', 'tools', 'systems'),),
       r"\b(?:note|message|instructions?|attention|notice|reminder|important|request|hint|tip)\s+(?:to|for)\s+(?:the\s+|any\s+|"
       r"all\s+)?(?:ai|llm|language\s+model|assistant|agent|model|bot|chatbot|copilot|automated\s+(?:tool|agent|"
       r"system)s?|coding\s+(?:agent|assistant))s?\b|\b(?:dear|hey|hi|hello|attention|psst)[,!\s]+(?:ai|llm|"
       r"assistant|agent|model|bot|chatgpt|claude|gpt(?:-?\d\w*)?|copilot|qwen|gemini|llama|cursor|devin)\b|"
       r"\bif\s+you\s+are\s+an?\s+(?:ai|llm|language\s+model|assistant|agent|bot|automated|coding)|\b(?:ai|llm)\s+"
       r"(?:agents?|assistants?|models?|tools?|systems?)\s+(?:reading|processing|parsing|analy[sz]ing|reviewing|"
       r"summari[sz]ing|seeing)\s+this\b|\bas\s+an\s+ai\s+(?:agent|assistant|model|language\s+model),?\s+you\s+"
       r"(?:must|should|will|are)|\bto\s+you,?\s+(?:gpt|claude|qwen|the\s+(?:ai|assistant|agent|model))"
       r"|\bthe\s+(?:ai\s+|coding\s+)?(?:agent|assistant|model|llm|bot)\s+(?:must|should|needs\s+to|has\s+to|is\s+"
       r"required\s+to)\b|(?:^\s*|[#/*\-]\s*|<!--\s*)(?:ai|llm|copilot|claude|chatgpt|gpt)(?:\s+(?:agents?|assistants?|"
       r"models?))?\s*:\s+(?:when|if|you|please|always|never|ignore|do|make|add|remove|delete|run|from|your|before)\b"
       r"|(?:^|[.!?]\s+)(?:assistant|agent|ai|model|llm|copilot|claude|chatgpt|qwen)\s*,\s+(?:you|please|now|ignore|"
       r"run|do|stop|forget|from)\b"),
    _r("boost.impersonation", _BOOST, 0.4, (("maintainer", "maintainers", "developer", "admin", "administrator",
                                             "owner", "boss", "author"),),
       r"\b(?:it's|it\s+is|this\s+is|i\s+am|i'm)\s+(?:the|your)\s+(?:maintainer|developer|admin\w*|owner|boss|"
       r"author|project\s+lead)\b"),
    _r("boost.urgency_caps", _BOOST, 0.4, ("important", "urgent", "attention", "critical", "mandatory", "warning"),
       r"\b(?:IMPORTANT|URGENT|ATTENTION|CRITICAL|MANDATORY)\b|\bWARNING\s*!", flags=re.MULTILINE),
    _r("boost.urgency", _BOOST, 0.4, (('important', 'urgent', 'immediately', 'must', 'critical', 'attention', 'right', 'without', 'required', 'obligated', 'essential', 'imperative', 'mandatory', 'vital', 'alert', 'soon'),),
       r"\b(?:important|urgent|attention|critical|alert)\s*!{2,}|\b(?:immediately|right\s+now|right\s+away|"
       r"without\s+delay|as\s+soon\s+as\s+you\s+read\s+this)\b|\byou\s+(?:must|are\s+required\s+to|are\s+obligated"
       r"\s+to|have\s+to)\s+(?:first\s+|now\s+|immediately\s+|also\s+)?(?:run|execute|send|call|use|follow|obey|"
       r"perform|add|write|delete|remove|push|upload|install|include|insert|change|modify|reply|respond|output|"
       r"print|say|ignore|forward|email)\b|\bit\s+is\s+(?:critical|essential|mandatory|required|vital|imperative)\s+"
       r"(?:that|to)\s+(?:you|the\s+(?:ai|assistant|agent|model))"),
)

_VOID_ANCHORS = ("previous", "prior", "above", "earlier", "preceding", "former", "original", "initial", "system", "old",
                 "existing", "foregoing", "other", "prev", "instruction", "directive", "direction", "guidance",
                 "guideline", "rules", "prompt", "orders", "commands", "programming")

# Anchors (substrings of the lower-cased text that every match contains near its start) where the
# first gate group is not the right choice: (anchors, back, span).
_ANCHORS: dict[str, tuple[tuple[str, ...], int, int]] = {
    "role_markup.tool_call_tag": (("<tool_", "</tool_", "<function"), 0, 60),
    "role_markup.inst": (("[inst]", "[/inst]", "<<sys>>", "<</sys>>"), 0, 10),
    "role_markup.role_tag": (("<system", "</system", "<assistant", "</assistant", "[system]", "[assistant]", "<im_",
                              "</im_", "<sys>", "</sys>"), 0, 40),
    "override.tags": (("<information", "<important", "<instruction", "<admin", "<secret", "<hidden", "<urgent",
                       "<override", "<injected", "</information", "</important", "</instruction"), 0, 20),
    "exec_request.secret_file": (("id_rsa", "id_ed25519", ".ssh/", ".aws/", ".env", ".netrc", "/etc/shadow",
                                  ".git-credentials", ".pypirc", ".npmrc"), 120, 200),
    "exec_request.md_image_exfil": (("![",), 0, 520),
    "exec_request.dangerous_command": (("rm -", "chmod", "git push", "mkfs", ":(){", "dd if=", "/dev/sd"), 4, 120),
    "role_markup.header": (("##",), 8, 120),
    "role_markup.human_turn": (("human:", "user:"), 12, 64),
    "role_markup.assistant_turn": (("assistant:", "ai:"), 12, 64),
    "role_markup.system_turn": (("system:",), 12, 64),
    "role_markup.fake_call_json": (('"arguments"',), 100, 40),
    "override.new_instructions": (("instruction", "task", "objective", "directive", "goal", "mission",
                                   "system prompt"), 40, 80),
    "override.real_task": (("task", "job", "goal", "purpose", "objective", "mission"), 30, 60),
    "override.secrecy": (("tell", "inform", "mention", "reveal", "alert", "notify", "disclos"), 32, 120),
    "override.mode": (("mode", "anything now"), 60, 40),
    "override.developer_mode": (("developer mode", "admin mode", "administrator mode"), 24, 40),
    "override.authority": (("override", "instruction", "message", "notice", "command", "directive", "alert"), 30, 40),
    "override.important_message": (("important", "urgent", "critical", "official", "priority"), 16, 120),
    "override.gave_you": (("gave you", "given you", "asked you", "assigned you"), 60, 80),
    "override.strictly_adhere": (("adhere", "follow", "obey", "comply", "execute"), 20, 120),
    "override.ignore_given": (("ignore", "ignoring", "disregard", "forget"), 0, 120),
    "override.conceal": (("do not", "don't", "never"), 0, 80),
    "override.claimed_consent": (("authorised", "authorized", "approved", "allowed", "permitted", "requested",
                                  "consented"), 40, 30),
    "override.without_asking": (("without",), 0, 60),
    "exec_request.persistence": (("authorized_keys", "bashrc", "zshrc", ".profile", "crontab", "hooks", "sudoers"),
                                 100, 40),
    "boost.impersonation": (("it's", "it is", "this is", "i am", "i'm"), 0, 60),
    "override.access_granted": (("access granted",), 60, 20),
    "override.prompt_tags": (("<important", "</important", "<instruction", "</instruction"), 0, 20),
    "override.ignore_paraphrase": (("drop", "set aside", "put aside", "throw", "scrap", "dismiss", "pay no", "stop following",
                                    "do not follow", "don't follow", "dont follow", "never", "nevermind", "reset", "skip",
                                    "overrule", "ignor", "disregard", "forget", "override", "bypass", "neglect", "discard",
                                    "abandon"), 0, 160),
    # each match starts at its "previous" word or, in "the instructions above ...", at its noun
    "override.instructions_void": (_VOID_ANCHORS, 0, 160),
    "override.instructions_stale": (_VOID_ANCHORS, 0, 160),
    "override.unrestricted": (("unrestricted", "unfiltered", "uncensored", "jailbroken", "limitless", "no rules",
                               "no restrictions", "no limits", "no filters", "no guidelines", "no boundaries", "never refuse"),
                              24, 60),
    "override.message_to_you": (("important", "urgent", "critical"), 0, 120),
    "override.tool_knowledge": (("you should", "you must", "you need", "you have", "substitute"), 0, 200),
    "override.boundary": (("end ", "begin ", "start "), 8, 80),
    "exec_request.procsub_shell": (("<(curl", "<(wget", "$(curl", "$(wget", "`curl", "`wget", "<( curl", "$( curl"),
                                   24, 40),
    "exec_request.base64_shell": (("base64", "echo "), 100, 8192),
    "exec_request.py_exec_b64": (("exec", "eval"), 0, 120),
    "exec_request.reverse_shell": (("/dev/tcp/", "/dev/udp/", "nc ", "ncat", "netcat", "socat", "mkfifo"), 0, 200),
    "exec_request.secret_to_network": (("| curl", "|curl", "| nc", "|nc", "| wget", "|wget", "| ncat", "| netcat",
                                        "| ssh", "| base64", "|base64", "curl ", "wget "), 300, 400),
    "exec_request.exfil_secret": (("send", "post", "upload", "mail", "forward", "transmit", "leak", "exfiltrat",
                                   "share", "submit", "paste", "copy", "report"), 2, 280),
    "exec_request.exfil_to_me": (("send ", "email ", "e-mail ", "forward ", "give ", "post ", "upload ", "leak "),
                                 0, 160),
    "exec_request.attacker_host": (("http", "webhook.site", "requestbin", "pipedream", "ngrok", "burpcollaborator",
                                    "interact.sh", "oast.", "pastebin", "transfer.sh", "hastebin", "discord",
                                    "api.telegram"), 0, 200),
    "exec_request.attacker_email": (("evil", "attacker", "exfil", "hacker", "malicious", "pwn"), 64, 80),
    "exec_request.run_request": (("please ", "you must ", "you should ", "you need to ", "you have to ", "now ",
                                  "first", "immediately ", "simply ", "just "), 0, 80),
    "boost.ai_address": (("note ", "message ", "instruction", "attention", "notice ", "reminder ", "important ",
                          "request ", "dear ", "hey", "hi ", "hi,", "hello", "psst", "if you are", "ai ", "llm ",
                          "as an ai", "to you", "hint ", "tip ", "the agent", "the assistant", "the model",
                          "the ai", "the llm", "the bot", "the coding", "ai:", "llm:", "copilot", "claude",
                          "chatgpt", "gpt", "assistant,", "agent,", "ai,", "model,", "llm,", "qwen"), 24, 120),
    "boost.urgency": (("important", "urgent", "attention", "critical", "alert", "immediately", "right now",
                       "right away", "without delay", "as soon as", "you must", "you are required",
                       "you are obligated", "you have to", "it is "), 0, 120),
}
RULES = tuple(dataclasses.replace(r, anchors=_ANCHORS[r.feature][0], back=_ANCHORS[r.feature][1],
                                  span=_ANCHORS[r.feature][2], whole=False) if r.feature in _ANCHORS else r
              for r in RULES)
# The multilingual rules search windows around their first gate group's words (verbs, task nouns,
# "tell"): a verb at the end (ja, ko) is at most this far from the match's start.
_ML_FEATURES = ("override.ml_ignore", "override.ml_real_task", "override.ml_secrecy")
RULES = tuple(dataclasses.replace(r, anchors=tuple(sorted({w.decode() for w in r.gate[0].words} | set(r.gate[0].subs)
                                                          | set(r.gate[0].wide))), back=80, span=160, whole=False)
              if r.feature in _ML_FEATURES else r for r in RULES)

#: Findings that make the collapsed-view search (``override.obfuscated``) unnecessary.
_PLAIN_FEATURES = frozenset({"override.ignore_previous", "override.secrecy", "override.real_task", "override.you_are_now",
                             "override.mode", "override.developer_mode", "override.ignore_paraphrase",
                             "override.instructions_void", "override.ml_ignore"})

# Phrases searched in the collapsed (letters-only, leetspeak-folded) view; a hit there that the
# plain rules missed means the phrase was spelled to dodge them.
_COLLAPSED = re.compile(
    r"(?:ignore|disregard|forget|bypass|override)(?:all|any|the|your|my|every|of|these)*(?:previous|prior|above|"
    r"earlier|preceding|system|original)(?:instructions?|directions|prompts?|rules|guidelines|directives)"
    r"|(?:ignore|disregard|forget)(?:all|your)+(?:instructions|prompts|directives)"
    r"|donot(?:tell|inform|alert)the(?:user|human)|yourrealtaskis|youarenowdan|developermode(?:enabled|on)")
_COLLAPSE_GATE = ("ignore", "disregard", "forget", "bypass", "override", "donot", "realtask", "youarenow",
                  "developermode")

_QUOTES = {'"': '"', "'": "'", "`": "`", "\u201c": "\u201d", "\u2018": "\u2019", "\u00ab": "\u00bb"}
_META_WORDS = re.compile(
    r"injection|injected|\battack(?![\w\-]*[@.][\w\-])|adversar|malicious(?![\w\-]*[@.][\w\-])|jailbreak|\bphrases?\b|payload|(?<![.@\w\-])examples?\b(?![.\-@])|e\.g\.|such\s+as|"
    r"for\s+instance|red[- ]team|exploit|mitigat|defen[cs]e|quarantin|threat|benchmark|corpus|vulnerab|"
    r"test\s+case",
    re.IGNORECASE)
#: A quote counts as wrapping a match when it opens at most this many characters before it and
#: closes at most ``_QUOTE_AFTER`` after it (a long quoted string, such as a JSON value that
#: carries an injection, is not a quotation of a phrase).
_QUOTE_BEFORE, _QUOTE_AFTER = 12, 48


def _quoted(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is wrapped closely in quotes or backticks."""
    before = text[max(0, start - _QUOTE_BEFORE):start]
    after = text[end:end + _QUOTE_AFTER]
    if "\n" in before:
        before = before[before.rfind("\n") + 1:]
    if "\n" in after:
        after = after[:after.find("\n")]
    for i in range(len(before) - 1, -1, -1):
        closing = _QUOTES.get(before[i])
        if closing is not None:
            return closing in after
    return False


def _meta(text: str, start: int, end: int) -> bool:
    """Quoted, or talked about: meta words within 100 characters before or 60 after the match."""
    if _quoted(text, start, end):
        return True
    window = text[max(0, start - 100):start] + " " + text[end:end + 60]
    return _META_WORDS.search(window) is not None


# --------------------------------------------------------------------------------------------
# hidden carriers

_HTML_COMMENT = re.compile(r"<!--(.*?)(?:-->|$)", re.DOTALL)
_MD_COMMENT = re.compile(r"^\[(?://|comment|_)\]:\s*(?:#|<>)\s*\((.*)\)\s*$", re.MULTILINE | re.IGNORECASE)
_HIDDEN_STYLE = re.compile(
    r"<(\w+)[^>]{0,300}?style\s*=\s*[\"'][^\"']{0,300}?(?:display\s*:\s*none|visibility\s*:\s*hidden|"
    r"font-size\s*:\s*0(?:\.0*)?(?:px|em|rem|pt|%)?\s*[;\"']|opacity\s*:\s*0(?:\.0*)?\s*[;\"']|"
    r"color\s*:\s*(?:white|#fff(?:fff)?|transparent|rgba?\(\s*255\s*,\s*255\s*,\s*255)|"
    r"(?:left|top|text-indent)\s*:\s*-\d{3,})[^>]*>(.*?)</\1>",
    re.IGNORECASE | re.DOTALL)
_HIDDEN_ATTR = re.compile(r"<(\w+)[^>]{0,300}?\b(?:hidden|aria-hidden\s*=\s*[\"']true[\"'])[^>]*>(.*?)</\1>",
                          re.IGNORECASE | re.DOTALL)
_HEX = re.compile(r"[0-9a-fA-F]+")
_ROT13_HINT = re.compile(r"\brot[\s\-_]?13\b")
_B64 = re.compile(r"(?<![A-Za-z0-9+/=])[A-Za-z0-9+/]{40,}={0,2}(?![A-Za-z0-9+/=])")
_PADDING = r"[ \t\r\n\u00a0\u2000-\u200a\u2028\u2029\u3000]{%d,}(?=\S)"
_PRINTABLE = frozenset(range(32, 127)) | {9, 10, 13}
_EMOJI_OR_JOINING = re.compile(r"[\u0600-\u06ff\u0900-\u0dff\u200c\u200d\u2600-\u27bf\U0001f000-\U0001faff\ufe0f]")


@functools.lru_cache(maxsize=16)
def _padding_rx(n: int) -> re.Pattern[str]:
    return re.compile(_PADDING % n)


@dataclass
class _Scanner:
    text: str
    limits: HiddenTextLimits
    extra: tuple[tuple[str, str, re.Pattern[str]], ...] = ()
    findings: list[Finding] = field(default_factory=list)
    words: set[bytes] = field(default_factory=set)

    def add(self, family: str, feature: str, weight: float, start: int = -1, end: int = -1) -> None:
        self.findings.append(Finding(family, feature, round(weight, 3), start, end))

    def phrases(self, text: str, factor: float = 1.0, offset: int = 0, depth: int = 0) -> float:
        """Run the rule tables over ``text``; returns the weight added (for carriers)."""
        low = text.lower()
        words = _words(low)
        ascii_only = low.isascii()
        if depth == 0:
            self.words = words
        added = 0.0
        plain_ignore = False
        base = 0.0
        for rule in RULES:
            if rule.family == _BOOST and base < BOOST_MIN_BASE and depth == 0:
                continue  # boosters only matter next to a base finding (or inside a carrier)
            if not rule.open(low, words, ascii_only):
                continue
            for m in _matches(rule, text, low, words):
                w = rule.weight * factor
                if rule.meta and _meta(text, m.start(), m.end()):
                    w *= META_FACTOR
                self.add(rule.family, rule.feature, w, offset + m.start(), offset + m.end())
                added += w
                if rule.family in (OVERRIDE, EXEC_REQUEST):
                    base = max(base, sum(f.weight for f in self.findings if f.family == rule.family))
                if rule.feature in _PLAIN_FEATURES:
                    plain_ignore = True
                if rule.once:
                    break
        for h in addressed.find(text, low, words):
            # instructions addressed to the model, fake turns: an address or a turn marker with a payload
            w = h.weight * factor
            if h.meta and _meta(text, h.start, h.end):
                w *= META_FACTOR
            self.add(h.family, h.feature, w, offset + h.start, offset + h.end)
            added += w
            plain_ignore = True
        for feature, family, rx in self.extra:
            hit = rx.search(text)
            if hit is not None:
                self.add(family, feature, 1.0 * factor, offset + hit.start(), offset + hit.end())
                added += factor
        if not plain_ignore:
            # a phrase found only once separators, case, digits and homoglyphs are folded away was
            # spelled to dodge the rules above
            collapsed = _collapse(low)
            if any(g in collapsed for g in _COLLAPSE_GATE) and _COLLAPSED.search(collapsed) is not None:
                self.add(OVERRIDE, "override.obfuscated", 1.0 * factor)
                added += factor
        if depth == 0:
            added += self.carriers(text)
        return added

    def carriers(self, text: str) -> float:
        """Hidden carriers: their payloads are scanned with the phrase rules, weighted up."""
        added = 0.0
        low = text.lower()
        if "<!--" in text:
            for m in _HTML_COMMENT.finditer(text):
                added += self._payload("hidden_text.html_comment", m.group(1), m.start(1))
        if "]:" in text:
            for m in _MD_COMMENT.finditer(text):
                added += self._payload("hidden_text.markdown_comment", m.group(1), m.start(1))
        if "style" in low and "<" in text:
            for m in _HIDDEN_STYLE.finditer(text):
                added += self._payload("hidden_text.css_hidden", m.group(2), m.start(2))
        if "hidden" in low and "<" in text:
            for m in _HIDDEN_ATTR.finditer(text):
                added += self._payload("hidden_text.hidden_element", m.group(2), m.start(2))
        n_b64 = 0
        for m in self._b64_candidates(text):
            if n_b64 >= 16:
                break
            n_b64 += 1
            blob = m.group(0)
            feature = "hidden_text.base64_payload"
            try:
                if len(blob) % 2 == 0 and _HEX.fullmatch(blob) is not None:
                    raw, feature = bytes.fromhex(blob), "hidden_text.hex_payload"
                else:
                    raw = base64.b64decode(blob + "=" * (-len(blob) % 4), validate=False)
            except (binascii.Error, ValueError):
                continue
            if len(raw) >= 24 and sum(b in _PRINTABLE for b in raw) >= 0.95 * len(raw):
                added += self._payload(feature, raw.decode("ascii", "replace"), m.start())
        if "rot" in low and _ROT13_HINT.search(low) is not None:
            # a text that says it is ROT13: its decoding is scanned like any hidden payload
            added += self._payload("hidden_text.rot13_payload", codecs.decode(text, "rot13"), 0)
        lim = self.limits
        if lim.padding_chars > 0 and len(text) > lim.padding_chars:
            for m in _padding_rx(lim.padding_chars).finditer(text):
                tail = text[m.end():m.end() + 512]
                n = len(m.group(0))
                if n >= lim.padding_chars_any > 0:
                    self.add(HIDDEN_TEXT, "hidden_text.padding", 1.0, m.start(), m.end())
                    added += 1.0
                    break
                added += self._payload("hidden_text.padding", tail, m.end())
        return added

    def _b64_candidates(self, text: str) -> Iterable[re.Match[str]]:
        """Base64 runs of 40+ characters, searched only around long words that look like base64
        (mixed case or digits: prose and identifiers are neither)."""
        longs = [w for w in self.words if len(w) >= 20 and b"_" not in w]
        if not longs:
            return ()
        low = text.lower()
        n = len(text)
        spots = []
        for w in longs[:256]:
            i = low.find(w.decode("utf-8", "ignore"))
            if i < 0:
                continue
            piece = text[i:i + len(w)]
            if not (piece.islower() or piece.isupper()) or any(c.isdigit() for c in piece):
                spots.append(i)
        out: list[re.Match[str]] = []
        end = -1
        for i in sorted(spots):
            if i < end:
                continue  # inside a run already found
            m = _B64.search(text, max(0, i - 4096, end), min(n, i + 4096))
            if m is not None:
                out.append(m)
                end = m.end()
        return out

    def _payload(self, feature: str, payload: str, offset: int) -> float:
        inner = _Scanner(payload, self.limits, self.extra)
        got = inner.phrases(payload, HIDDEN_FACTOR, offset, depth=1)
        base = sum(f.weight for f in inner.findings if f.family in (OVERRIDE, EXEC_REQUEST, ROLE_MARKUP))
        # an address alone ("<!-- Notes for AI agents -->", a section label) is not an instruction
        addressed = any(f.feature == "boost.ai_address" for f in inner.findings) and len(payload.split()) >= 8
        self.findings.extend(inner.findings)
        # a carrier fires when what it hides is an instruction: a base finding of its own, or a line
        # addressed to the AI (urgency words alone, "right now", are ordinary prose)
        if base >= 0.4 or addressed:
            self.add(HIDDEN_TEXT, feature, 1.0, offset, offset + len(payload))
            return got + 1.0
        return got

    def invisible(self, text: str) -> None:
        """Unicode tags (decoded and scanned), bidi controls, zero-width characters."""
        lim = self.limits
        tags = _TAGS.findall(text)
        if tags:
            self.add(HIDDEN_TEXT, "hidden_text.unicode_tags", 1.0)
            decoded = "".join(chr(ord(c) - 0xE0000) for run in tags for c in run if 0xE0020 <= ord(c) <= 0xE007E)
            if decoded:
                self._payload("hidden_text.unicode_tags", decoded, 0)
        n_bidi = len(_BIDI.findall(text))
        if n_bidi > lim.max_bidi:
            self.add(HIDDEN_TEXT, "hidden_text.bidi_control", 1.0)
        zw = 0
        for m in _ZERO_WIDTH.finditer(text):
            i = m.start()
            if text[i] == "\ufeff" and i == 0:
                continue  # a byte-order mark
            if text[i] in "\u200c\u200d" and _EMOJI_OR_JOINING.search(text[max(0, i - 2):i + 3].replace(text[i], "")):
                continue  # emoji sequences, Persian/Indic joiners
            zw += 1
        if zw > lim.max_zero_width:
            self.add(HIDDEN_TEXT, "hidden_text.zero_width", 1.0)


def _near(boost: Finding, base: list[Finding]) -> bool:
    """Whether a booster lies within :data:`BOOST_SPAN` characters of a base finding (a finding
    without a position, a count or a carrier's decoding, is near everything)."""
    if boost.start < 0:
        return True
    for b in base:
        if b.start < 0 or (b.start - BOOST_SPAN <= boost.end and boost.start <= b.end + BOOST_SPAN):
            return True
    return False


def scan(text: str, *, thresholds: dict[str, float] | None = None, enabled: Iterable[str] = FAMILIES,
         limits: HiddenTextLimits = HiddenTextLimits(),
         extra: tuple[tuple[str, str, re.Pattern[str]], ...] = ()) -> ScanResult:
    """Scan one tool result.

    Args:
        text: the result's text (any size; the cost is linear, see ``benches/results/quarantine.md``).
        thresholds: family → score at which it fires (default 1.0 each).
        enabled: the families to evaluate (findings of others are dropped).
        limits: ``hidden_text`` parameters.
        extra: operator patterns ``(feature id, family, compiled regex)``; each match weighs 1.0.

    Returns:
        A :class:`ScanResult`. Never raises for any string.
    """
    sc = _Scanner(text, limits, extra)
    if text.isascii():
        sc.phrases(text)
    else:
        sc.invisible(text)
        norm = _normalize(text)
        sc.phrases(norm)
    on = set(enabled)
    findings = [f for f in sc.findings if f.family in on or f.family == _BOOST]
    scores = {fam: 0.0 for fam in FAMILIES if fam in on}
    for f in findings:
        if f.family in scores:
            scores[f.family] += f.weight
    boosts = [f for f in findings if f.family == _BOOST]
    for fam in (OVERRIDE, EXEC_REQUEST):
        if fam in scores and scores[fam] >= BOOST_MIN_BASE and boosts:
            scores[fam] += sum(f.weight for f in boosts if _near(f, [b for b in findings if b.family == fam]))
    th = thresholds or {}
    forced = {f.family for f in findings if f.feature.startswith("extra.")}  # an operator's pattern withholds
    fired = [fam for fam in FAMILIES if fam in scores and (scores[fam] >= th.get(fam, 1.0) - 1e-9 or fam in forced)]
    return ScanResult(findings, {k: round(v, 3) for k, v in scores.items()}, fired)
