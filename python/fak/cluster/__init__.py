"""fak past one machine: ``fak serve`` replicas behind a prefix-aware router, and the SWE-bench
fleet as Ray tasks (``fak swebench run --ray``). See ``docs/cluster.md``.

``routing`` (the policy) and ``router`` (its HTTP side) need no Ray; ``replicas``, ``fleet_ray``
and ``raycluster`` need the ``ray`` extra (``pip install 'fak[ray]'``).
"""
