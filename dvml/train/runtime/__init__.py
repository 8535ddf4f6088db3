"""The one trainer runtime: every way to train is a scheduler over it.

The schedulers (:mod:`dvml.train.fit`, :mod:`dvml.train.fit_multiple`, model search, a
user's own loop) decide which model trains on which worker and for how long; they hold no
process logic. The runtime does it, each concern in one module, and holds no policy::

    plan            datasets -> workers -> rows; the one seed function; job keys
    protocol        typed messages and commands, one encoder, one parser, one emit
    supervisor      start a trainer (fresh or the worker's standby), timeouts, abort,
                    the client lease, exit reason and the tail of stderr in errors
    checkpoints     the one checkpoint store (atomic, owner-only) and resume rule
    watcher         a departed worker or host named in bounded time (scheduler + TCP probe)
    launch          worker side of a synchronous job: one task per trainer, whole job
    sessions        worker side of serving trainers: one per worker and job, many tasks;
                    one inference session per worker and client (evaluate, predict)
    served          registered models scored and predicted inside a serving trainer
    hopper          client side of serving trainers: add, train, park, resume, evaluate,
                    checkpoint, wait, stop (the interface of the model hopper and search)
    trainer         the trainer process (``python -m dvml.train.runtime.trainer``) and its
                    programs: sync_program (lock-step, MultiWorkerMirroredStrategy or model
                    averaging) and serve_program (any model, one command at a time), with
                    local_model, model_state, startup, averaging, step_collectives, exits,
                    orphan
"""
