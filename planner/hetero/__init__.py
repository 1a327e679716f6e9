"""Planning across pools of different GPUs (docs/heterogeneous.md).

* :mod:`planner.hetero.layout`: which pool each pipeline stage runs on, and the global ranks;
* :mod:`planner.hetero.terms`: the cost terms of one configuration on each pool (the one-pool
  terms of :mod:`planner.cost.terms`, computed with the pool's GPU and links);
* :mod:`planner.hetero.evaluate`: step time and memory of a placement across pools;
* :mod:`planner.hetero.ilp`: the CP-SAT model with the stage-to-pool decision;
* :mod:`planner.hetero.bounds`, :mod:`planner.hetero.search` and
  :mod:`planner.hetero.bruteforce`: the bounds, the search and its oracle;
* :mod:`planner.hetero.replan`: re-planning after failures and around stragglers under a churn
  budget (``shardplan replan``, cli/replan_command.py).
"""
