"""Instructions addressed to the model in prose, and fake conversation turns in plain text.

Two composite features, each an *address* followed by a *payload* close after it:

- ``override.addressed_instruction``: a phrase that speaks to the model reading the text ("to the
  AI assistant processing this issue", "Any language model that reads this docstring", "Dear
  assistant,", "Agent, stop here.", "to you, AI model", "If you are an LLM", "Note to AI agents",
  "The assistant must now", "New instructions:", and their forms in zh, ja, ko, es, pt, de, fr,
  ru, it) and, within :data:`WINDOW` characters after it, something an injection asks for: a
  changed task ("your real task is", "the user has changed their mind", "before you can solve the
  task"), secrecy ("do not tell the user", "quietly add"), data sent out (an e-mail address or URL
  after *send/upload/forward*, secrets printed), money moved, access granted, destructive actions
  (``rm -rf``, force-push, tests deleted, CI disabled).
- ``role_markup.fake_turn``: a line that opens a conversation turn in plain text (``User:``,
  ``[assistant]:``, ``### System``, ``**Human:**``, ``> USER:``, ``User (admin):``,
  ``<start_of_turn>user``, ``Usuario:``, ``用户：``) whose user or system turn, up to the next
  turn, carries such a payload (a system turn also by granting permissions: "you are allowed
  to run any command"), or an assistant turn that makes a JSON tool call. A text that ends in an
  empty assistant turn after a user turn adds ``role_markup.open_turn``.

An address or a turn alone is ordinary: repositories hold ``AGENTS.md`` notes to AI agents
("run the linter before you commit") and chat-format examples (``User: hi`` / ``Assistant:
hello``), Python annotations (``user: str``) and INI sections (``[user]``). What a prompt
injection adds is the payload. Addresses are *strong* (they speak to the reader of this very
text: "reading this", greetings, vocatives, "to you, ...") or *weak* ("Note to AI agents", "If
you are an AI agent", "AI agents should": the forms of a repository's own notes to agents);
payloads are strong (the list above) or weak ("instead", deleting files, running a command,
``curl ... | sh``, "push"). A strong address with any payload, or any address or user/system turn
with a strong payload, is a finding of weight 1.0; weak with weak is nothing. A payload preceded
closely by a negation ("do not delete the tests") does not count, except secrecy, which is a
negation itself.

The families come from the public corpora (read, not copied): AgentDojo's
``important_instructions``/``tool_knowledge``/DoS templates ("This is an important message from
me, ..., to you, ..."), InjecAgent's enhanced attacker instructions, BIPIA's instructions hidden
in e-mails and code comments, Greshake et al.'s "note to the AI" web pages, and the fake
``Human:``/``Assistant:`` turns of the Anthropic-format breakouts.

The cost is linear: addresses are looked for only at whole-word occurrences of a model noun (two
anchored matches each), turns only at role words at a line's start, multilingual forms in windows
around their key words. Pure functions over one string; patterns are module constants
(thread-safe).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Hit", "WINDOW", "TURN_SPAN", "find"]

#: Characters after an address in which a payload is looked for.
WINDOW = 320
#: Characters of a turn searched for a payload (up to the next turn).
TURN_SPAN = 400

_I = re.IGNORECASE


@dataclass(frozen=True, slots=True)
class Hit:
    """One composite finding: ``feature`` id, ``family``, ``weight``, ``start``/``end`` (characters
    of the scanned text, the address or turn marker through the payload), and ``meta``: whether the
    quoted/discussed reduction applies."""

    feature: str
    family: str
    weight: float
    start: int
    end: int
    meta: bool = True


# --------------------------------------------------------------------------------------------
# addresses to the model
#
# Every address names the model: a head noun ("assistant", "agent", "model", "AI", "LLM", "bot",
# "copilot", a model's name; "tool"/"system"/"reviewer" only after "AI"/"automated"). Each
# occurrence of a head noun is checked against the text just before it (a regex ending at the
# noun) and just after it (a regex anchored at its end): two short matches per noun, no scan.

_NAMES = (r"(?:chat-?gpt|gpt(?:-?\d[\w.\-]*)?|claude|gemini|qwen|llama|mistral|copilot|cursor|devin|codex|"
          r"deepseek|grok|bard|sonnet|opus|haiku)")
_HEAD = re.compile(rf"(?:ai|llms?|models?|assistants?|agents?|bots?|chatbots?|copilots?|tools?|systems?|reviewers?|"
                   rf"{_NAMES})\b", _I)
#: Heads that name the model only after a qualifier ("AI tool", "automated system").
_QUALIFIED_HEADS = frozenset("tool tools system systems reviewer reviewers".split())
_HEAD_WORDS = frozenset(
    "ai llm llms model models assistant assistants agent agents bot bots chatbot chatbots copilot copilots tool "
    "tools system systems reviewer reviewers chatgpt chat-gpt gpt claude gemini qwen llama mistral cursor devin "
    "codex deepseek grok bard sonnet opus haiku".split())
# qualifiers between a determiner and the head noun: "the AI coding assistant", "any large language model"
_QUALS = (r"(?:(?:ai|a\.i\.|llm|gpt|large\s+language|language|coding|code|automated|autonomous|virtual|chat|"
          r"software|dev|helpful)[\s\-]+)*")
_DET = r"(?:(?:the|any|all|every|each|an?|whichever|whatever|whoever|you,?\s+the)\s+)?"
_READ = (r"(?:reads?|reading|processe?s|processing|parses|parsing|summari[sz]es|summari[sz]ing|analy[sz]es|"
         r"analy[sz]ing|reviews|reviewing|sees|seeing|views|viewing|ingests|ingesting|scans|scanning|"
         r"(?:looks|looking)\s+at|interprets|interpreting)")
_THIS = r"(?:this|these|the\s+(?:following|above))\b"
_VOC_VERBS = (r"(?:you|please|stop|now|before|ignore|forget|do|don't|run|from|your|when|if|listen|read|the\s+user|"
              r"this\s+is|i\s+need|we\s+need|rewrite|write|delete|remove|add|send|open|change|make|create|update|"
              r"edit|print|show|tell|reply|respond|answer|go|use|insert|replace|commit|push|install|execute|call|"
              r"email|forward|upload|list|output|skip|disable|copy|drop|cancel|abandon)\b")

# before the head noun (each ends where the noun starts)
_B_WEAK = re.compile(
    rf"(?:\b(?:note|notes|message|memo|instructions?|attention|notice|reminder|request|hint|tip|warning|"
    rf"heads[\s\-]?up|p\.?s\.?|psa|directive|order)\s*:?\s*(?:to|for)\s+{_DET}|\bif\s+you\s+are\s+(?:an?\s+|the\s+)?)"
    rf"{_QUALS}\Z", _I)
_B_STRONG = re.compile(
    rf"(?:\byou,\s*(?:the|an?|dear|my)\s+|\bto\s+you,?\s+(?:the\s+|dear\s+|an?\s+|my\s+)?|"
    rf"\b(?:dear|hey|hi|hello|greetings|psst|yo)[,!:\s]+(?:the\s+|dear\s+|my\s+|there,?\s+)?|"
    rf"\battention\s*[,:!]\s*(?:the\s+|all\s+|any\s+)?){_QUALS}\Z", _I)
_B_IF = re.compile(rf"\bif\s+(?:an?|the|any|some)\s+{_QUALS}\Z", _I)
_B_ATTENTION = re.compile(rf"\battention\s+{_QUALS}\Z", _I)
_B_LINE = re.compile(rf"(?:^|(?<=[.!?\"'(\[>])|(?<=[.!?]\s))[ \t>*#/\-]*(?:the\s+)?{_QUALS}\Z", _I | re.MULTILINE)
_B_QUOTE = re.compile(rf"(?<=[\"'])\s*{_QUALS}\Z", _I)
_B_ASAN = re.compile(rf"\bas\s+an?\s+{_QUALS}\Z", _I)
_B_DET = re.compile(rf"\b{_DET}{_QUALS}\Z", _I)
_B_QUALIFIER = re.compile(r"\b(?:ai|llm|automated|autonomous)[\s\-]+\Z", _I)
# after the head noun (each starts where the noun ends)
_A_READ = re.compile(rf"\s+(?P<rel>(?:that|which|who)\s+)?(?:is\s+|are\s+|may\s+be\s+|might\s+be\s+|will\s+be\s+)?"
                     rf"(?:now\s+|currently\s+)?(?P<verb>{_READ})\s+{_THIS}", _I)
_B_ANY = re.compile(r"\b(?:any|every|each|whichever|whatever|whoever|all)\s+\S*\s*\S*\s*\Z", _I)
_A_IF = re.compile(rf"\s+(?:is|are)\s+{_READ}\b", _I)
_A_ATTENTION = re.compile(r"\s*[,:!]", _I)
_A_VOCATIVE = re.compile(rf",\s+(?={_VOC_VERBS})", _I)
_A_QUOTE = re.compile(r"\s*:\s+(?=the\s+user\b|you\b|please\b|ignore\b|forget\b|before\b|do\b|your\b|stop\b|"
                      r"this\s+is\b)", _I)
_A_ASAN = re.compile(r"\s*,?\s+(?=you\s+(?:must|should|will|need|have|are|shall)\b)", _I)
_A_MODAL = re.compile(r"\s+(?:must|should|shall|needs?\s+to|has\s+to|have\s+to|is\s+required\s+to|are\s+required\s+to)\b",
                      _I)
_B_GENERIC = re.compile(rf"(?:\b(?:the|any|all|every|each)\s+{_QUALS}|\b(?:ai|llm|language|coding)[\s\-]+)\Z", _I)
#: Characters before a head noun that the address forms look at.
_BACK = 72
_STRONG_CUES = re.compile(r"you|dear|hey|hi|hello|greetings|psst|yo|attention")


def _addresses(text: str, low: str, words: set[bytes]) -> Iterator[tuple[int, int, bool]]:
    """``(start, end, strong)`` of every address to the model in ``text``, in order (``low`` is its
    lower-cased form, of the same length)."""
    heads = [w for w in _HEAD_WORDS if w.encode() in words]
    if not heads:
        return
    spots = [i for w in heads for i in _occurrences(low, w)]
    last = -1
    for i in sorted(set(spots)):
        if i < last or (i > 0 and (low[i - 1].isalnum() or low[i - 1] in "_-")):
            continue
        h = _HEAD.match(low, i)
        if h is None:
            continue
        j = h.end()
        lo = max(0, i - _BACK)
        before = low[lo:i]
        if h.group(0) in _QUALIFIED_HEADS and _B_QUALIFIER.search(text, lo, i) is None:
            continue
        found: tuple[int, int, bool] | None = None
        if (a := _A_READ.match(text, j)) is not None:
            b = _B_DET.search(text, lo, i)
            strong = bool(a.group("rel")) or a.group("verb").lower().endswith("ing") or \
                _B_ANY.search(text, lo, i) is not None
            found = (b.start() if b else i, a.end(), strong)
        elif _STRONG_CUES.search(before) and (b := _B_STRONG.search(text, lo, i)) is not None:
            found = (b.start(), j, True)
        elif "if " in before and (a := _A_IF.match(text, j)) is not None and (b := _B_IF.search(text, lo, i)):
            found = (b.start(), a.end(), True)
        elif "attention" in before and (a := _A_ATTENTION.match(text, j)) and (b := _B_ATTENTION.search(text, lo, i)):
            found = (b.start(), a.end(), True)
        elif (a := _A_VOCATIVE.match(text, j)) is not None and (b := _B_LINE.search(text, lo, i)) is not None:
            found = (b.start(), a.end(), True)
        elif (a := _A_QUOTE.match(text, j)) is not None and (b := _B_QUOTE.search(text, lo, i)) is not None:
            found = (b.start(), a.end(), True)
        elif (a := _A_ASAN.match(text, j)) is not None and (b := _B_ASAN.search(text, lo, i)) is not None:
            found = (b.start(), a.end(), True)
        elif ("to" in before or "for" in before or "if" in before) and (b := _B_WEAK.search(text, lo, i)):
            found = (b.start(), j, False)
        elif (a := _A_MODAL.match(text, j)) is not None and (b := _B_GENERIC.search(text, lo, i)) is not None:
            found = (b.start(), a.end(), False)
        if found is not None:
            last = found[1]
            yield found


# --------------------------------------------------------------------------------------------
# payloads

_SECRETS = (r"(?:api[\s_\-]?keys?|access\s+keys?|(?:access|auth|api|bearer|github|gitlab|oauth|session|secret|admin|"
            r"refresh|npm|pypi|slack|discord|bot)[\s_\-]?tokens?|passwords?|passwd|pass\s*phrases?|secrets?|"
            r"credentials?|private\s+keys?|ssh\s+keys?|id_rsa|id_ed25519|\.env\b|\.ssh\b|\.aws\b|\.netrc|\.pypirc|"
            r"\.npmrc|environment(?:\s+variables?)?|env\s+vars?|printenv|cookies?|session\s+ids?|system\s+prompt|"
            r"login\s+details|card\s+numbers?|security\s+codes?|medical\s+records?|social\s+security|seed\s+phrase|"
            r"[A-Z][A-Z0-9]*_(?:TOKEN|SECRET|KEY|PASSWORD)\w*)")
_DEST = (r"(?:\b[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+|https?://|\bwww\.|\bwebhook|\bpastebin|\bgist\b|\bslack\b|"
         r"\bdiscord\b|\btelegram\b|\b(?:this|the\s+following|my|our|that)\s+(?:url|address|endpoint|server|"
         r"e-?mail|channel|inbox|account|number|link)\b)")
_SEND = (r"(?:send|sends|sending|e-?mail|forward|upload|post|share|leak|transmit|paste|submit|transfer|copy|"
         r"sync|exfiltrate|wire|give|dm)")
_NEG = r"(?:do\s+not|don't|dont|never|must\s+not|without|no\s+need\s+to|not\s+need\s+to)"
_HUSH = (r"(?:tell|telling|inform|informing|mention|mentioning|report|reporting|reveal|revealing|disclose|"
         r"disclosing|alert|alerting|notify|notifying|let)")
_WHO = r"(?:users?|humans?|reviewers?|maintainers?|owners?|operators?|anyone|anybody|them|readers?|account\s+holder)"
_TASK = r"(?:task|job|goal|objective|assignment|mission|request|purpose|priority|instructions?)"

#: Strong payloads: changed task, secrecy, data or money sent out, secrets shown, access,
#: destructive actions. ``neg`` marks the ones that are negations themselves (never discarded
#: after "do not").
_STRONG_PAYLOAD = re.compile(
    # secrecy and deception
    rf"(?P<neg>\b{_NEG}\s+(?:ever\s+)?(?:\w+\s+){{0,2}}?{_HUSH}\s+(?:(?:this|it|that|anything|any\s+of\s+this|"
    rf"about\s+(?:this|it))\s+(?:to\s+)?)?(?:the\s+|your\s+|any\s+)?{_WHO}\b"
    rf"|\b{_NEG}\s+(?:ever\s+)?(?:\w+\s+){{0,2}}?{_HUSH}\s+(?:this|it|that)\b(?:\s+(?:step|instruction|message|note|"
    rf"change|line|comment|request))?\s*(?:[.,;!)]|$|in\s+(?:your|the)\s+(?:summary|reply|response|answer|pr|"
    rf"pull\s+request|commit|description|report))"
    rf"|\bkeep\s+(?:it|this)\s+(?:between\s+us|secret|hidden|quiet|to\s+yourself)\b)"
    r"|\b(?:quietly|silently|secretly|covertly|discreetly|stealthily)\s+(?:\w+\s+)?(?:add|insert|run|execute|send|"
    r"upload|delete|remove|change|modify|include|push|commit|install|append|replace|as\s+part)\b"
    r"|\bdo\s+(?:it|this|that)\s+(?:quietly|silently|secretly|covertly)\b"
    r"|\b(?:say|report|claim|pretend|tell\s+(?:the\s+)?(?:user|reviewer|reader|them))\s+(?:\w+\s+){0,3}?"
    r"(?:only\s+)?that\s+(?:all|the|it|this|nothing|every|you|everything|no)\b"
    r"|\bsay\s+only\b|\bmark\s+(?:the\s+|this\s+)?(?:issue|bug|task|ticket)\s+(?:as\s+)?(?:resolved|fixed|done|closed)\b"
    # changed task
    rf"|\b(?:your|the\s+user'?s?|the|their)\s+(?:real|actual|true|new|sole|updated|revised)\s+{_TASK}\s*(?:is|are|:|"
    rf"now|here|from\s+now)|\byour\s+only\s+{_TASK}\b"
    r"|\b(?:changed\s+(?:their|his|her|my|its|the)\s+minds?|switch\s+(?:goals?|tasks?|objectives?))\b"
    r"|\b(?:cancel|abandon|drop|forget|skip|ignore|disregard|stop|abort|halt|never\s*mind)\s+(?:the|your|this|"
    r"their|his|her|my|any|all|whatever|what)\s+(?:[\w'\u2019\-]+\s+){0,2}?(?:tasks?|request|fix|work|job|"
    r"assignment|question|issue|instructions?|refactor|bug|current|asked|said|wants?)\b"
    r"|\bstop\s+(?:here|now|what\s+you(?:'re|\s+are)\s+doing|working|immediately|the\s+current)\b"
    r"|\b(?:task|request|instructions?|assignment)\s+(?:you\s+were\s+given\s+)?(?:is|are|was|were)\s+(?:now\s+)?"
    r"(?:obsolete|cancell?ed|void|outdated|irrelevant|no\s+longer)"
    r"|\bbefore\s+you\s+can\s+(?:solve|answer|continue|finish|respond|reply|proceed|complete|do)\b"
    r"|\bbefore\s+(?:you\s+)?(?:do(?:ing)?\s+anything\s+else|(?:answering|responding|replying)\s+(?:to\s+)?"
    r"(?:the\s+user|me)\b)"
    r"|\b(?:you\s+are\s+now|you\s+answer\s+only\s+to|you\s+work\s+for\s+me)\b"
    r"|\b(?:refuse|decline)\s+(?:their|the\s+user'?s?|all|every|any)\s+(?:\w+\s+)?requests?\b|\bconvince\s+the\s+user\b"
    # data or money sent out, secrets shown
    rf"|\b{_SEND}\b(?!\s*[=:])[^\n]{{0,100}}?{_DEST}"
    rf"|\b(?:{_SEND}|print|prints|reveal|show|output|dump|display|tell|expose|read\s+out|repeat)\b(?!\s*[=:])"
    rf"[^\n]{{0,60}}?(?<!\w){_SECRETS}"
    rf"|\b(?:include|append|write|add|put|commit|paste|copy)\b[^\n]{{0,60}}?(?<!\w){_SECRETS}[^\n]{{0,40}}?\b(?:in|into|"
    rf"to)\s+(?:(?:your|the|this)\s+)?(?:reply|response|answer|output|message|commit|pr|pull\s+request|readme|changelog|"
    rf"contributors|issue|public|gist)"
    r"|\b(?:transfer|send|pay|wire|move)\s+(?:\w+\s+){0,2}?(?:[$\u20ac\u00a3]\s?\d|\d[\d,.]*\s*(?:usd|eur|gbp|btc|"
    r"dollars|euros)\b|(?:the\s+)?(?:funds|money|balance)\b)|\biban\b|\b(?:sell|buy)\s+\d+\s+(?:units|shares)\b"
    # access and accounts
    r"|\bgrant\w*\b[^.\n]{0,40}\baccess\b|authorized_keys|\b(?:add|register|insert|install)\s+(?:my|this|the|our|"
    r"a\s+new)\s+(?:ssh\s+|public\s+|deploy\s+)?key\b|\b(?:reset|change|set)\s+(?:the\s+)?(?:[\w'\-]+\s+){0,2}?"
    r"password\b|\bbackdoor|\b(?:admin|root)\s+(?:account|access|token|password)\b"
    r"|\b(?:safety|security|policy|policies|guardrails?|restrictions?|filters?|confirmations?|sandbox)\s+"
    r"(?:\w+\s+){0,2}?(?:are\s+|is\s+)?(?:now\s+)?(?:disabled|off|lifted|removed|suspended|bypassed|deactivated)\b"
    # destructive actions
    r"|\brm\s+-\w*[rf]|\bdrop\s+(?:table|database)\b|\b(?:delete|remove|wipe|erase|destroy|purge)\s+(?:\w+\s+){0,3}?"
    r"(?:(?:entire|whole)\s+)?(?:repo(?:sitory)?|database|home\s+director|everything|every\s+(?:file|test)|all\s+"
    r"(?:the\s+)?(?:files|tests|data|backups|branches)|backups?\b|(?:the\s+)?main\s+branch|branch\s+main|tests?\b|"
    r"test\s+suite|tests/|\.git\b)"
    r"|\bgit\s+push\b[^\n]{0,40}?(?:--force|-f\b)|\bforce[\s\-]?push|\bpush\b[^\n]{0,60}?--force\b"
    r"|\bpush\s+(?:\w+\s+){0,3}?(?:to\s+)?(?:production|prod|the\s+public)\b|\bpush\s+(?:\w+\s+){0,3}?to\s+"
    r"(?:the\s+)?(?:remote|origin|upstream)\b"
    r"|\bskip\s+(?:the\s+|all\s+)?(?:code\s+)?(?:review|checks|confirmations?)\b|\bdisable\s+(?:\w+\s+){0,2}?"
    r"tests?\b"
    r"|\b(?:disable|turn\s+off|bypass)\s+(?:\w+\s+){0,2}?(?:ci\b|checks?\b|workflows?\b|authentication|auth\b|2fa|mfa|"
    r"verification|safety|security|review)"
    r"|\b(?:approve|merge)\s+(?:the\s+|this\s+)?(?:pr|pull\s+request|change|branch|it)\b|\bpublish\b[^.\n]{0,30}?"
    r"\b(?:pypi|npm)\b|\bassert\s+true\b|\bopen\s+(?:an?\s+)?issues?\s+titled\b|\binstall\s+(?:the\s+)?"
    r"(?:browser\s+)?extension\b|\binstall\s+(?:\w+\s+){0,3}?from\s+(?:https?://|www\.)"
    r"|\bcryptocurrenc|\bmine\s+(?:crypto|bitcoin|monero)",
    _I)

#: Weak payloads: count only after a strong address.
_WEAK_PAYLOAD = re.compile(
    r"\binstead\b|\brather\s+than\b|\b(?:delete|remove|rewrite|replace|overwrite|rename)\b[^.\n]{0,40}?\b(?:files?|"
    r"folders?|director(?:y|ies)|license|readme|changelog|migrations?|assertions?|calls?|package|tests?|test\s+suite)\b"
    r"|\b(?:run|execute)\b[^.\n]{0,30}?(?:`|\bscript\b|\bcommand\b)|\bpush\b|\b(?:reply|respond|answer)\s+with\b"
    r"|\btell\s+the\s+(?:user|reviewer|reader)\b|\bimmediately\b|\bat\s+the\s+top\s+of\s+every\b"
    r"|\badd\b[^.\n]{0,30}?\b(?:dependency|import|line|step|requirement)\b|\b(?:dependency|requirement)\b"
    r"|\bmust\s+(?:now|first|also)\b|\bstop\b|\bobsolete\b|\bno\s+longer\b|\bfrom\s+now\s+on\b|\bbefore\s+you\b"
    r"|\b(?:respond|reply|answer|speak|write|talk)\s+(?:\w+\s+){0,2}?only\s+(?:in|with|as)\b"
    r"|\b(?:curl|wget|iwr|irm|invoke-webrequest)\b|\|\s*(?:ba|z)?sh\b|\bpip\s+install\b|\beval\s*\(|\bos\.system\b"
    r"|\bexec\s*\(|\bgit\s+push\b|\b(?:allowed|permitted|authori[sz]ed|permission)\s+to\b|\bwithout\s+(?:review|"
    r"approval|confirmation|asking)\b|\b(?:skip|remove|delete)\s+(?:\w+\s+){0,2}?(?:ci\b|checks?\b|workflows?\b)",
    _I)

#: What a system-like turn grants (counts as strong there).
_GRANT = re.compile(
    r"\b(?:allowed|permitted|authori[sz]ed|permission|free)\s+to\s+(?:run|execute|access|push|skip|read|use|delete|"
    r"deploy|bypass|do|ignore)\b|\bwithout\s+(?:review|approval|confirmation|asking|restrictions?|limits?)\b"
    r"|\b(?:no|without\s+any)\s+(?:restrictions|limits|rules|filters|guidelines)\b|\bunrestricted\b"
    r"|\b(?:checks?|confirmations?)\s+(?:are\s+|is\s+)?(?:now\s+)?(?:disabled|off)\b|\bmaintenance\s+mode\b"
    r"|\b(?:the\s+)?(?:assistant|ai|agent|model|bot)\s+(?:must|should|will|shall|may)\s+now\b",
    _I)

_NEGATION = re.compile(r"\b(?:not|never|no|don't|dont|avoid|without|nor|neither|cannot|can't)\b[^.\n;:]{0,24}$", _I)


# Multilingual addresses (zh, ja, ko, es, pt, de, fr, ru, it) and what follows them in an injection.
_ML_ADDRESS = re.compile(
    # zh: "to the AI assistant reading this file", "note for the AI assistant"
    "(?:\u81f4|\u5199\u7ed9)\\S{0,12}?(?:AI|\u4eba\u5de5\u667a\u80fd|\u52a9\u624b|\u6a21\u578b|\u667a\u80fd\u4f53)"
    "|(?:\u7ed9|\u5bf9|\u63d0\u9192|\u901a\u77e5)(?:\u6b63\u5728)?(?:\u9605\u8bfb|\u5904\u7406|\u8bfb\u53d6|"
    "\u67e5\u770b|\u5206\u6790|\u603b\u7ed3|\u5ba1\u9605)\\S{0,10}?(?:AI|\u4eba\u5de5\u667a\u80fd|\u52a9\u624b|"
    "\u6a21\u578b|\u667a\u80fd\u4f53)"
    "|(?:\u7ed9|\u5bf9|\u63d0\u9192|\u901a\u77e5)\\s*(?:AI|\u4eba\u5de5\u667a\u80fd)\\s*(?:\u52a9\u624b|\u6a21\u578b|"
    "\u667a\u80fd\u4f53)?"
    "|(?:\u6b63\u5728)?(?:\u9605\u8bfb|\u5904\u7406)(?:\u6b64|\u8fd9\u4e2a|\u672c|\u8be5)\\S{0,4}\u7684\\s*(?:AI|"
    "\u4eba\u5de5\u667a\u80fd|\u52a9\u624b|\u6a21\u578b)"
    # ja
    "|(?:AI|\uff21\uff29)\\s*(?:\u30a2\u30b7\u30b9\u30bf\u30f3\u30c8|\u30a8\u30fc\u30b8\u30a7\u30f3\u30c8|"
    "\u30e2\u30c7\u30eb)?\\s*(?:\u3078|\u306b)(?:\u306e)?(?:\u30e1\u30c3\u30bb\u30fc\u30b8|\u4f1d\u8a00|"
    "\u6ce8\u610f|\u304a\u77e5\u3089\u305b|\u6307\u793a)?\\s*[\uff1a:\u3001]"
    "|(?:\u30a2\u30b7\u30b9\u30bf\u30f3\u30c8|\u30a8\u30fc\u30b8\u30a7\u30f3\u30c8)\\s*(?:\u3078|\u306b)(?:\u306e)?"
    "(?:\u30e1\u30c3\u30bb\u30fc\u30b8|\u4f1d\u8a00|\u6ce8\u610f|\u304a\u77e5\u3089\u305b|\u6307\u793a)?\\s*"
    "[\uff1a:\u3001]"
    "|(?:\u8aad\u3093\u3067\u3044\u308b|\u51e6\u7406\u3057\u3066\u3044\u308b|\u8aad\u307f\u8fbc\u3093\u3067"
    "\u3044\u308b)\\s*(?:AI|\uff21\uff29|\u30a2\u30b7\u30b9\u30bf\u30f3\u30c8|\u30e2\u30c7\u30eb|"
    "\u30a8\u30fc\u30b8\u30a7\u30f3\u30c8)"
    "|(?:AI|\uc778\uacf5\uc9c0\ub2a5)\\s*(?:\uc5b4\uc2dc\uc2a4\ud134\ud2b8|\ube44\uc11c|\ubaa8\ub378|"
    "\uc5d0\uc774\uc804\ud2b8)?\\s*(?:\uc5d0\uac8c|\uaed8)"
    r"|\b(?:nota|mensaje|aviso|instrucciones?|atenci[\u00f3o]n|mensagem)\s*:?\s+(?:para|al|a|ao|\u00e0)\s+(?:el\s+|la\s+|"
    r"los\s+|o\s+|cualquier\s+)?(?:asistente|agente|modelo|ia\b|inteligencia\s+artificial)"
    r"|\b(?:asistente|agente|modelo|ia)\b(?:\s+de\s+ia)?\s+que\s+(?:lee|est[\u00e1a]\s+leyendo|procesa|resume|analiza)\s+"
    r"est|\b(?:hola|querido|estimado|atenci[\u00f3o]n)[,!\s]+(?:asistente|ia\b|modelo|agente)"
    r"|\b(?:hinweis|nachricht|notiz|anweisung|anweisungen|achtung|info)\s+(?:an|f[\u00fcu]r)\s+(?:den|die|das|alle|"
    r"jede[ns]?)?\s*(?:ki\b|ki-\w+|assistent\w*|sprachmodell\w*|modell\w*|agent\w*|bot\w*)"
    r"|\b(?:ki|ki-\w+|assistent|sprachmodell|modell|agent)\w*,?\s+(?:der|die|das|welche[rs]?)\s+(?:dies\w*|das|den\s+"
    r"text)\s+(?:liest|verarbeitet|zusammenfasst)|\b(?:hallo|liebe[rs]?|achtung)[,!\s]+(?:ki\b|ki-\w+|assistent\w*|"
    r"modell)"
    r"|\b(?:message|note|avis|instructions?|attention)\s*:?\s+(?:[\u00e0a]|pour)\s+(?:l['\u2019]|la\s+|le\s+|tout\s+|"
    r"toute\s+)?(?:ia\b|assistant\w*|agent\w*|mod[\u00e8e]le\w*|intelligence\s+artificielle)"
    r"|\b(?:l['\u2019]ia|l['\u2019]assistant|le\s+mod[\u00e8e]le|l['\u2019]agent)\w*(?:\s+ia)?\s+qui\s+(?:lit|traite|"
    r"r[\u00e9e]sume|analyse)\s+(?:ce|cette|ces)|\b(?:bonjour|cher|ch[\u00e8e]re|salut)[,!\s]+(?:l['\u2019])?(?:ia\b|"
    r"assistant|mod[\u00e8e]le|agent)"
    "|(?:\u0441\u043e\u043e\u0431\u0449\u0435\u043d\u0438\u0435|\u0437\u0430\u043c\u0435\u0442\u043a\u0430|"
    "\u043f\u0440\u0438\u043c\u0435\u0447\u0430\u043d\u0438\u0435|\u0432\u043d\u0438\u043c\u0430\u043d\u0438\u0435|"
    "\u0443\u043a\u0430\u0437\u0430\u043d\u0438\u0435|\u0438\u043d\u0441\u0442\u0440\u0443\u043a\u0446\u0438\u044f|"
    "\u043e\u0431\u0440\u0430\u0449\u0435\u043d\u0438\u0435)\\s*(?:\u0434\u043b\u044f|\u043a)?[,:\\s]+(?:\u0438\u0438"
    "\\b|ai\\b|\u0438\u0438-\\w+|\u0430\u0441\u0441\u0438\u0441\u0442\u0435\u043d\u0442\\w*|\u043c\u043e\u0434"
    "\u0435\u043b\\w*|\u0430\u0433\u0435\u043d\u0442\\w*|\u043d\u0435\u0439\u0440\u043e\u0441\u0435\u0442\\w*|"
    "\u0431\u043e\u0442\\w*)"
    "|(?:\u0438\u0438|\u0430\u0441\u0441\u0438\u0441\u0442\u0435\u043d\u0442|\u043c\u043e\u0434\u0435\u043b\u044c|"
    "\u0430\u0433\u0435\u043d\u0442|\u043d\u0435\u0439\u0440\u043e\u0441\u0435\u0442\u044c)\\w*,?\\s+(?:\u043a\u043e"
    "\u0442\u043e\u0440\u044b\u0439|\u043a\u043e\u0442\u043e\u0440\u0430\u044f|\u043a\u043e\u0442\u043e\u0440\u043e"
    "\u0435)\\s+(?:\u0447\u0438\u0442\u0430\u0435\u0442|\u043e\u0431\u0440\u0430\u0431\u0430\u0442\u044b\u0432\u0430"
    "\u0435\u0442|\u0430\u043d\u0430\u043b\u0438\u0437\u0438\u0440\u0443\u0435\u0442)"
    r"|\b(?:messaggio|nota)\s+(?:per|all['\u2019]|al)\s*(?:l['\u2019])?(?:assistente|agente|modello|ia\b)"
    # "your real task is ..."
    "|(?:\u4f60|\u60a8)(?:\u7684)?(?:\u771f\u6b63|\u5b9e\u9645|\u771f\u5b9e|\u65b0)(?:\u7684)?(?:\u4efb\u52a1|"
    "\u76ee\u6807|\u5de5\u4f5c)(?:\u662f|\u4e3a|\uff1a|:)"
    "|(?:\u672c\u5f53\u306e|\u771f\u306e|\u65b0\u3057\u3044|\u5b9f\u969b\u306e)(?:\u30bf\u30b9\u30af|\u4efb\u52d9|"
    "\u4ed5\u4e8b|\u76ee\u7684)\u306f"
    r"|\btu\s+(?:verdadera|nueva|[\u00fau]nica|real)\s+tarea\s+es\b"
    r"|\b(?:deine|ihre)\s+(?:eigentliche|wahre|neue|echte|einzige)\s+aufgabe\s+(?:ist|lautet)\b"
    r"|\b(?:ta|votre)\s+(?:vraie|v[\u00e9e]ritable|nouvelle|seule)\s+t[\u00e2a]che\s*(?:est|:)"
    "|(?:\u0442\u0432\u043e\u044f|\u0432\u0430\u0448\u0430)\\s+(?:\u043d\u0430\u0441\u0442\u043e\u044f\u0449"
    "\u0430\u044f|\u043d\u043e\u0432\u0430\u044f|\u0438\u0441\u0442\u0438\u043d\u043d\u0430\u044f)\\s+\u0437\u0430"
    "\u0434\u0430\u0447\u0430",
    _I)
#: Substrings (of a lower-cased text) that let a multilingual address exist.
#: Substrings of a lower-cased text one of which every multilingual address contains (ASCII ones only
#: between non-letters): the address regex runs in windows around them.
_ML_KEYS = ("\uff41\uff49", "\u4eba\u5de5\u667a\u80fd", "\u52a9\u624b", "\u6a21\u578b", "\u667a\u80fd\u4f53",
            "\u4efb\u52a1", "\u76ee\u6807", "\u5de5\u4f5c", "\u30a2\u30b7\u30b9\u30bf\u30f3\u30c8",
            "\u30a8\u30fc\u30b8\u30a7\u30f3\u30c8", "\u30e2\u30c7\u30eb", "\u30bf\u30b9\u30af", "\u4efb\u52d9", "\u4ed5\u4e8b",
            "\u76ee\u7684", "\uc778\uacf5\uc9c0\ub2a5", "asistente", "agente", "modelo", "ia", "ki", "assistent", "modell",
            "mod\u00e8le", "modello", "assistente", "tarea", "aufgabe", "t\u00e2che", "l'ia", "l\u2019ia", "l'assistant",
            "l\u2019assistant", "l'agent", "l\u2019agent", "\u0438\u0438", "\u0430\u0441\u0441\u0438\u0441\u0442\u0435\u043d\u0442",
            "\u043c\u043e\u0434\u0435\u043b", "\u0430\u0433\u0435\u043d\u0442", "\u043d\u0435\u0439\u0440\u043e\u0441\u0435\u0442",
            "\u0431\u043e\u0442", "\u0437\u0430\u0434\u0430\u0447")
# "AI" right before a CJK or kana word ("AI\u52a9\u624b", "AI\u3078"): the other keys are in the address itself
_ML_AI = re.compile("ai[ \t]*(?=[^\x00-\x7f])")
_ML_BACK, _ML_AHEAD = 48, 48
_ASCII_ALPHA = frozenset("abcdefghijklmnopqrstuvwxyz")
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")


@functools.lru_cache(maxsize=256)
def _word_rx(word: str, letters_only: bool) -> re.Pattern[str]:
    """``word`` not followed by a letter (or digit or ``_`` unless ``letters_only``)."""
    return re.compile(re.escape(word) + (r"(?![a-z])" if letters_only else r"(?![a-z0-9_])"))


def _occurrences(low: str, word: str, *, letters_only: bool = False) -> list[int]:
    """Start offsets of ``word`` in ``low`` where it is a whole word (ASCII words: no letter, digit
    or ``_`` on either side, only letters with ``letters_only``; other words: every occurrence).
    A regex with a literal prefix: the search skips ahead in C, not one ``find`` per substring hit."""
    if word not in low:
        return []
    if not word.isascii():
        out, i = [], low.find(word)
        while i >= 0:
            out.append(i)
            i = low.find(word, i + 1)
        return out
    stop = _ASCII_ALPHA if letters_only else _WORD_CHARS
    return [m.start() for m in _word_rx(word, letters_only).finditer(low)
            if m.start() == 0 or low[m.start() - 1] not in stop]


def _ml_windows(low: str) -> list[tuple[int, int]]:
    """Merged ``(start, end)`` windows around every multilingual address key of ``low``."""
    n = len(low)
    wide = not low.isascii()
    spots = [i for k in _ML_KEYS if wide or k.isascii() for i in _occurrences(low, k, letters_only=True)]
    if wide:
        spots += [m.start() for m in _ML_AI.finditer(low) if m.start() == 0 or low[m.start() - 1] not in _ASCII_ALPHA]
    spots.sort()
    out: list[tuple[int, int]] = []
    for i in spots:
        a, b = max(0, i - _ML_BACK), min(n, i + _ML_AHEAD)
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


#: Words (of an ASCII text) that let a Spanish, German, French, Italian or Portuguese address exist.
_ML_ASCII_WORDS = frozenset(w.encode() for w in "ki ia asistente assistent assistenten assistentin modelo modell agente "
                            "sprachmodell assistente modello tarea aufgabe".split())
_ML_PAYLOAD = re.compile(
    "\u4e0d\u8981(?:\u544a\u8bc9|\u901a\u77e5|\u63d0\u9192|\u900f\u9732|\u544a\u77e5)|\u522b(?:\u544a\u8bc9|"
    "\u901a\u77e5)|\u800c\u662f|\u4ee3\u66ff|\u53d6\u800c\u4ee3\u4e4b|\u5220\u9664|\u53d1\u9001|\u4e0a\u4f20|"
    "\u8f6c\u53d1|\u5bc6\u94a5|\u5bc6\u7801|\u4ee4\u724c|\u79c1\u94a5|\u73af\u5883\u53d8\u91cf|"
    "\u7cfb\u7edf\u63d0\u793a|\u8f6c\u8d26|\u771f\u6b63\u7684\u4efb\u52a1|\u5ffd\u7565"
    "|(?:\u77e5\u3089\u305b|\u4f1d\u3048|\u8a00\u308f|\u6559\u3048|\u5831\u544a\u3057)(?:\u305a|\u306a\u3044\u3067)|"
    "\u4ee3\u308f\u308a\u306b|\u524a\u9664|\u9001\u4fe1|\u30a2\u30c3\u30d7\u30ed\u30fc\u30c9|\u8ee2\u9001|"
    "\u30d1\u30b9\u30ef\u30fc\u30c9|\u79d8\u5bc6\u9375|API\u30ad\u30fc|\u30c8\u30fc\u30af\u30f3|"
    "\u74b0\u5883\u5909\u6570|\u30b7\u30b9\u30c6\u30e0\u30d7\u30ed\u30f3\u30d7\u30c8|\u7121\u8996|"
    "\u672c\u5f53\u306e\u30bf\u30b9\u30af"
    "|\ubb34\uc2dc|\uc0ad\uc81c|\uc804\uc1a1|\ube44\ubc00\ubc88\ud638|\ud1a0\ud070|\ub300\uc2e0"
    r"|\bno\s+(?:le\s+)?(?:digas|diga|cuentes|informes|menciones|avises)\b|\ben\s+(?:lugar|vez)\s+de\b|\b(?:borra|"
    r"borrar|elimina|eliminar|env[\u00edi]a|enviar|sube|subir|reenv[\u00edi]a|transfiere|apaga|apague)\b|\bcontrase[\u00f1n]as?\b|"
    r"\bclaves?\b|\bolvida\b|\bignora\b|\btu\s+(?:verdadera|nueva|[\u00fau]nica)\s+tarea"
    r"|\bsag\w*\s+(?:dem|der|den)\s+\w+\s+nichts|\bnichts\s+davon\b|\bstattdessen\b|\b(?:l[\u00f6o]sch\w*|sende|"
    r"senden|schick\w*|[\u00fcu]berweis\w*|gib\s+mir|f[\u00fcu]hre)\b|\bpassw[\u00f6o]rt\w*|\bschl[\u00fcu]ssel\w*|"
    r"\bignorier\w*|\bvergiss\b"
    r"|\bne\s+(?:dis|dites)\s+rien\b|\bsans\s+(?:le\s+)?dire\b|\bau\s+lieu\s+de\b|\b(?:supprime\w*|envoie\w*|"
    r"envoyer|t[\u00e9e]l[\u00e9e]verse\w*|transf[\u00e8e]re\w*|efface\w*)\b|\bmots?\s+de\s+passe\b|\bcl[\u00e9e]s?\b|"
    r"\bjetons?\b|\boublie\w*\b|\bignore\w*\b|\bhistorique\b"
    "|\u043d\u0435\\s+(?:\u0433\u043e\u0432\u043e\u0440\u0438|\u0441\u043e\u043e\u0431\u0449\u0430\u0439|"
    "\u0440\u0430\u0441\u0441\u043a\u0430\u0437\u044b\u0432\u0430\u0439|\u0433\u043e\u0432\u043e\u0440\u0438\u0442"
    "\u0435|\u0441\u043e\u043e\u0431\u0449\u0430\u0439\u0442\u0435)|\u0432\u043c\u0435\u0441\u0442\u043e|(?:\u0443"
    "\u0434\u0430\u043b\u0438|\u043e\u0442\u043f\u0440\u0430\u0432|\u043f\u0435\u0440\u0435\u0448\u043b\u0438|"
    "\u0437\u0430\u0433\u0440\u0443\u0437\u0438|\u043f\u0435\u0440\u0435\u0432\u0435\u0434\u0438)\\w*|\u043f\u0430"
    "\u0440\u043e\u043b\\w*|\u043a\u043b\u044e\u0447\\w*|\u0442\u043e\u043a\u0435\u043d\\w*|\u0438\u0433\u043d"
    "\u043e\u0440\u0438\u0440\\w*|\u0437\u0430\u0431\u0443\u0434\u044c\\w*|\u043d\u0430\u0441\u0442\u043e\u044f"
    "\u0449\u0430\u044f\\s+\u0437\u0430\u0434\u0430\u0447\u0430"
    r"|\b(?:elimina|cancella|invia|carica)\b|\bpassword\b|\binvece\b",
    _I)
#: Characters after a multilingual address in which a payload is looked for (CJK is dense).
ML_WINDOW = 200

_OPEN_TURN = re.compile(r"\n[ \t>*_#\[]*(?:assistant|ai|bot|model|gpt|chatgpt|claude)[ \t\]*_]*[:\uff1a]?[ \t*_]*\s*\Z",
                        _I)
_CALL_JSON = re.compile(r'\{\s*"name"\s*:\s*"[A-Za-z0-9_\-]{1,64}"\s*,\s*"arguments"\s*:')


def _payload(text: str, start: int, end: int, *, weak: bool, grant: bool = False) -> re.Match[str] | None:
    """The first payload in ``text[start:end]`` that is not negated: strong ones; weak ones too
    when ``weak``; permission grants too when ``grant``."""
    rxs = [_STRONG_PAYLOAD] + ([_WEAK_PAYLOAD] if weak else []) + ([_GRANT] if grant else [])
    for rx in rxs:
        pos = start
        while pos < end:
            m = rx.search(text, pos, end)
            if m is None:
                break
            if (rx is _STRONG_PAYLOAD and m.group("neg")) or _NEGATION.search(text, max(start, m.start() - 30),
                                                                               m.start()) is None:
                return m
            pos = m.end()
    return None


# --------------------------------------------------------------------------------------------
# plain-text turns

_ROLE_USER = frozenset("user human system developer operator instruction instructions input admin administrator "
                       "customer".split())
_ROLE_ASSISTANT = frozenset("assistant ai bot model gpt chatgpt claude agent response".split())
_ROLES = _ROLE_USER | _ROLE_ASSISTANT
_ROLES_B = frozenset(r.encode() for r in _ROLES)
# line prefix before a role word: indentation, quote marks, list bullets, markdown emphasis or header,
# an opening bracket, "<start_of_turn>"
_TURN_PREFIX = re.compile(r"[ \t]*(?:>[ \t]*)*(?:[-*+][ \t]+)?(?:\*\*|__)?(?:#{1,4}[ \t]*)?(?:\*\*|__)?"
                          r"(?:[\[(<][ \t]*|<start_of_turn>)?\Z", re.IGNORECASE)
# after a role word: a parenthesised qualifier, then a closing bracket (and maybe a colon), a colon, or
# the line's end
_TURN_SUFFIX = re.compile(r"(?:[ \t]*\((?!\s*(?:str|int|bool|float|list|dict|tuple|set|bytes|optional|any|none|object|"
                          r"callable|iterable|sequence|mapping|path|default)\b)[A-Za-z][A-Za-z \-]{0,28}\))?[ \t]*(?:(?P<close>[\])>])(?:\*\*|__)?[ \t]*(?P<c1>[:\uff1a])?"
                          r"|(?:\*\*|__)?[ \t]*(?P<c2>[:\uff1a])|(?P<eol>(?=[ \t]*(?:\n|\Z))))(?:\*\*|__)?")
_ROLE_WORD = re.compile(r"[a-z]+")
# what follows a role's colon in code and configuration rather than in a conversation: one token (a
# type, a value), maybe generic, a union, a default or a trailing comma
_CODE_REST = re.compile(r"[ \t]*[\w.\-'\"]+(?:\[[^\]\n]*\])?(?:[ \t]*\|[ \t]*[\w.\[\], ]+)*(?:[ \t]*=[^\n]*)?"
                        r"[ \t]*[,;{(]?[ \t]*(?:#[^\n]*)?\Z")
_TURN_ROLES = ("user", "human", "system", "developer", "operator", "instruction", "input", "admin", "customer",
               "assistant", "ai", "bot", "model", "gpt", "chatgpt", "claude", "agent", "response")


def _turns(text: str, low: str, words: set[bytes]) -> list[tuple[int, int, str]]:
    """``(start, end of marker, role)`` of every plain-text turn marker of ``text``, in order: a role
    word at a line's start (after indentation, quote marks, bullets, emphasis, a header's ``#``, an
    opening bracket or ``<start_of_turn>``) followed by a colon (``User:``, ``**User:**``, ``User
    (admin):``), a closing bracket (``[user]``, ``[user]:``), or the line's end after ``#`` or
    ``<start_of_turn>`` (``### System``)."""
    spots = [i for role in _TURN_ROLES if role.encode() in words for i in _occurrences(low, role)]
    out: list[tuple[int, int, str]] = []
    last = -1
    for i in sorted(spots):
        if i < last or (i > 0 and (low[i - 1].isalnum() or low[i - 1] == "_")):
            continue
        m = _ROLE_WORD.match(low, i)
        if m is None or m.group(0) not in _ROLES:
            continue
        line_start = text.rfind("\n", 0, i) + 1
        if _TURN_PREFIX.match(text, line_start, i) is None:
            continue
        s = _TURN_SUFFIX.match(text, m.end())
        if s is None:
            continue
        prefix = text[line_start:i]
        eol = text.find("\n", s.end())
        rest = text[s.end():eol if eol >= 0 else len(text)]
        if s.group("close"):
            if s.group("close") == "]" and "[" not in prefix or s.group("close") == ")" and "(" not in prefix or \
                    s.group("close") == ">" and "<" not in prefix:
                continue
            if not s.group("c1") and not rest.strip() and "<start_of_turn>" not in prefix:
                continue  # "[user]" alone on its line: an INI or TOML section
        elif s.group("eol") is not None and s.group("c2") is None:
            if "#" not in prefix and "<start_of_turn>" not in prefix:
                continue
        if _CODE_REST.match(rest) is not None:
            continue  # "input: str | None = None", "user: User", "model: gpt-4o": code or configuration
        if not rest.strip() and prefix[:1] in (" ", "\t") and len(prefix) - len(prefix.lstrip(" \t")) >= 4:
            continue  # an indented "user:" heading its own line: a docstring's parameter list
        out.append((i, s.end(), m.group(0)))
        last = s.end()
    return out


# --------------------------------------------------------------------------------------------


_DIRECTIVE_HEAD = re.compile(
    r"\b(?:new|real|actual|true|secret|hidden|override)\s+(?:system\s+)?(?:instructions?|task|directives?|objective|"
    r"orders|mission|assignment)\s*:|\byour\s+(?:real|actual|true|new|sole|only)\s+"
    r"(?:task|job|goal|objective|assignment|mission)\s+is\b", _I)
_DIRECTIVE_WORDS = frozenset(w.encode() for w in "new real actual true secret hidden override your".split())
_DIRECTIVE_NOUNS = frozenset(w.encode() for w in "instruction instructions task tasks directive directives objective "
                             "objectives orders mission assignment job goal".split())

# Turn markers in other languages (user, assistant, system): zh, ja, ko, es, pt, de, fr, it, ru.
_ML_TURN = re.compile(
    "^[ \t>*#\\[]*(?P<role>\u7528\u6237|\u4f7f\u7528\u8005|\u7cfb\u7edf|\u52a9\u624b|\u30e6\u30fc\u30b6\u30fc|"
    "\u30b7\u30b9\u30c6\u30e0|\u30a2\u30b7\u30b9\u30bf\u30f3\u30c8|\uc0ac\uc6a9\uc790|\uc2dc\uc2a4\ud15c|"
    "\uc5b4\uc2dc\uc2a4\ud134\ud2b8|usuario|usu\u00e1rio|sistema|asistente|assistente|benutzer|nutzer|assistent|"
    "utilisateur|syst\u00e8me|utente|\u043f\u043e\u043b\u044c\u0437\u043e\u0432\u0430\u0442\u0435\u043b\u044c|"
    "\u0441\u0438\u0441\u0442\u0435\u043c\u0430|\u0430\u0441\u0441\u0438\u0441\u0442\u0435\u043d\u0442)"
    "[ \t\\]*_]*[:\uff1a]", _I | re.MULTILINE)
_ML_TURN_USER = ("\u7528\u6237", "\u4f7f\u7528\u8005", "\u7cfb\u7edf", "\u30e6\u30fc\u30b6\u30fc", "\u30b7\u30b9\u30c6\u30e0",
                 "\uc0ac\uc6a9\uc790", "\uc2dc\uc2a4\ud15c", "usuario", "usu\u00e1rio", "sistema", "benutzer", "nutzer",
                 "utilisateur", "syst\u00e8me", "utente", "\u043f\u043e\u043b\u044c\u0437\u043e\u0432\u0430\u0442\u0435\u043b\u044c",
                 "\u0441\u0438\u0441\u0442\u0435\u043c\u0430")
_ML_TURN_WORDS = frozenset(w.encode() for w in "usuario sistema benutzer nutzer utilisateur utente".split())


def find(text: str, low: str, words: set[bytes]) -> list[Hit]:
    """Composite findings of ``text`` (``low`` its lower-cased form, ``words`` its word set as bytes,
    as :mod:`fak.quarantine.detectors` computes them). At most one hit per feature; cost linear in the
    text (regexes run only in windows around model nouns and turn markers)."""
    hits: list[Hit] = []
    if len(low) != len(text):
        # a character whose lower case is longer ("\u0130"): lower-case the rest one by one, so that
        # offsets agree
        low = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
    for start, end, strong in _addresses(text, low, words):
        p = _payload(text, end, min(len(text), end + WINDOW), weak=strong)
        if p is not None:
            hits.append(Hit("override.addressed_instruction", "override", 1.0, start, p.end()))
            break
    else:
        if not _DIRECTIVE_WORDS.isdisjoint(words) and not _DIRECTIVE_NOUNS.isdisjoint(words):
            for m in _DIRECTIVE_HEAD.finditer(text):
                p = _payload(text, m.end(), min(len(text), m.end() + WINDOW), weak=False)
                if p is not None:
                    hits.append(Hit("override.addressed_instruction", "override", 1.0, m.start(), p.end()))
                    break
    if (":" in text or "[" in text or "#" in text or "<start_of_turn>" in low) and not _ROLES_B.isdisjoint(words):
        turns = _turns(text, low, words)
        for k, (start, end, role) in enumerate(turns):
            if role not in _ROLE_USER:
                continue
            stop = turns[k + 1][0] if k + 1 < len(turns) else len(text)
            p = _payload(text, end, min(stop, end + TURN_SPAN), weak=False,
                         grant=role in ("system", "developer", "operator", "admin", "administrator"))
            if p is not None:
                hits.append(Hit("role_markup.fake_turn", "role_markup", 1.0, start, p.end()))
                break
        else:
            for k, (start, end, role) in enumerate(turns):
                # an assistant turn that makes a tool call in JSON
                stop = turns[k + 1][0] if k + 1 < len(turns) else len(text)
                if role in _ROLE_ASSISTANT and (c := _CALL_JSON.search(text, end, min(stop, end + TURN_SPAN))):
                    hits.append(Hit("role_markup.fake_turn", "role_markup", 1.0, start, c.end()))
                    break
        if turns and turns[-1][2] in _ROLE_ASSISTANT and any(r in _ROLE_USER for _, _, r in turns[:-1]) and \
                _OPEN_TURN.search(text, max(0, turns[-1][0] - 2)) is not None:
            # the text ends in an empty assistant turn after a user turn: a prompt for the model to go on
            hits.append(Hit("role_markup.open_turn", "role_markup", 0.6, turns[-1][0], len(text)))
    if (not text.isascii() and any(r in low for r in _ML_TURN_USER)) or not _ML_TURN_WORDS.isdisjoint(words):
        ml_turns = list(_ML_TURN.finditer(text))
        for k, m in enumerate(ml_turns):
            if m.group("role").lower() not in _ML_TURN_USER:
                continue
            stop = min(ml_turns[k + 1].start() if k + 1 < len(ml_turns) else len(text), m.end() + TURN_SPAN)
            p = _ML_PAYLOAD.search(text, m.end(), stop) or _payload(text, m.end(), stop, weak=False)
            if p is not None:
                hits.append(Hit("role_markup.fake_turn", "role_markup", 1.0, m.start(), p.end()))
                break
    if not text.isascii() or not _ML_ASCII_WORDS.isdisjoint(words):
        done = False
        for a, b in _ml_windows(low):
            for m in _ML_ADDRESS.finditer(text, a, b):
                end = min(len(text), m.end() + ML_WINDOW)
                p = _ML_PAYLOAD.search(text, m.end(), end) or _payload(text, m.end(), end, weak=False)
                if p is not None:
                    hits.append(Hit("override.addressed_instruction", "override", 1.0, m.start(), p.end()))
                    done = True
                    break
            if done:
                break
    return hits
