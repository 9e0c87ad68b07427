"""SWE-bench for fak: datasets (``dataset``), task repositories (``repos``), one instance through
the agent (``instance``), the fleet (``fleet``: ``fak swebench run``) and the staged pipeline
(``pipeline``), both run by one driver (``driver``: pool or Ray, live table, Ctrl-C, the output
files), grading (``eval``: the official harness; ``local``/``envs``: local grading without
Docker), and the CLI (``cli``)."""
