"""The runtime: K real node processes, their supervision, and the online clock.

``trainer`` (LocalTrainer.fit) with ``fit_config`` (its arguments checked into the node's configuration) and ``job``
(what one fit runs, resolved in the parent) → ``run`` (the supervisor: rendezvous, node processes, messages, failures)
→ ``node`` (one rank's life) with ``batches`` (its data, epoch order and micro-batches), ``dist_calls`` (the
strategy's own ``torch.distributed`` calls, routed through its Communicator), ``object_store`` (the directory behind
``comm.put`` and ``comm.get``), ``transport`` (how models, datasets and strategies reach the nodes), ``messages``
(what nodes and the parent tell each other), ``record`` (history and trace from node messages), ``divergence`` (a
runaway loss stops or warns), ``pipeline`` (a ``Staged`` model cut into stages on different nodes: ``fit(pipeline=)``)
with ``boundary`` (codecs for what crosses between stages), ``watchdog`` (progress), ``checkpoint``, ``clock`` (the
online simulated clock), ``clock_link`` (a node's side of it), ``forkserver`` (the server nodes are forked from),
``rendezvous`` (a store on loopback only), ``signals`` (SIGTERM and SIGHUP save like Ctrl-C), ``runlock`` (one fit per
run directory) and ``torchrun`` (the same fit under an external launcher). What a fit hands back and writes on the
side: ``finish`` (a finished fit's result, run directory and simulation), ``fit_result`` (FitResult, the door to
simulation), ``gymlog`` (the older gym's CSV logs), ``wandb_log``
(Weights & Biases), ``storage`` (a run directory copied to S3). Beside them: ``testing`` (models and strategies that
fail or stall on purpose, importable by nodes) and ``reference`` (the ``fit`` arguments table the runtime README
holds, generated from the code).
"""
