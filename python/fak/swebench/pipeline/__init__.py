"""The staged pipeline of ``fak swebench run --agent pipeline`` (after Agentless: localize, repair
with many samples, reproduction and regression tests, rerank), beside the agent loop.

Stages, in order, each a module (``config.STAGES``):

====================  ====================================================  =======
stage                 what it does                                          model?
====================  ====================================================  =======
``locate``            rank files and functions from the issue's clues       no
                      (``git grep -F``, ``ast``)
``choose``            the model votes for the file, then the function       yes
``repair``            many SEARCH/REPLACE samples per location; drop what   yes
                      does not apply, changes nothing or does not parse;
                      deduplicate
``reproduce``         reproduction scripts written by the model             yes
``test``              scripts and regression tests on the original code,    no (runs code)
                      then on each candidate, in the sandbox
``rank``              order the candidates, choose one patch                no
====================  ====================================================  =======

Artifacts: ``OUTPUT/pipeline/ID/STAGE.jsonl`` (``artifacts.py``); a finished stage is reused
when its inputs and budget are unchanged, so the generating stages can run on one machine and
``test,rank`` on another. Only ``task.task_view`` of a dataset row is read (the honesty boundary).
"""

from fak.swebench.pipeline.config import (
    MODEL_STAGES,
    STAGES,
    PipelineConfig,
    parse_stages,
)

__all__ = ["MODEL_STAGES", "STAGES", "PipelineConfig", "parse_stages"]
