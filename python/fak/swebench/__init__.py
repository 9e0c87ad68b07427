"""SWE-bench for fak: datasets (``dataset``), task repositories (``repos``), the fleet
(``run``: ``fak swebench run``), grading (``eval``: the official harness; ``local``/``envs``:
local grading without Docker), and the CLI (``cli``)."""
