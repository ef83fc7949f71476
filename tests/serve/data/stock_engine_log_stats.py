"""``../shared/peer/stock_engine.py`` with the engine's statistics on: the same stock vLLM engine
core (tcp handshake only) without ``--disable-log-stats``, so that every step's outputs carry
vLLM's ``SchedulerStats`` and request events, what an API server's metrics and stats line are
made of. Run with the peer venv's python: ``stock_engine_log_stats.py PEER_DIR MODEL tcp://HOST:PORT
[-- extra engine args]``."""

import sys

if __name__ == "__main__":  # not in the engine process vLLM spawns, which imports this file again
    peer_dir = sys.argv.pop(1)
    sys.path.insert(0, peer_dir)

    import stock_engine

    stock_args = stock_engine.engine_cli_args
    stock_engine.engine_cli_args = lambda model, extra: [a for a in stock_args(model, extra)
                                                         if a != "--disable-log-stats"]
    sys.exit(stock_engine.main())
