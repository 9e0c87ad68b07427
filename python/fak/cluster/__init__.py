"""fak past one machine: ``fak serve`` replicas behind a prefix-aware router, and the cluster
the SWE-bench fleet's Ray tasks run on (``fak swebench run --ray``: ``fak.swebench.fleet``). See
``docs/cluster.md``.

``routing`` (the policy) and ``router`` (its HTTP side) need no Ray; ``replicas`` and
``raycluster`` need the ``ray`` extra (``pip install 'fak[ray]'``).
"""
