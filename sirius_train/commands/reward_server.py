"""`sirius reward-server`: the execution reward over HTTP, shared by every rollout worker of a node.

See docs/REWARD_SERVER.md for the protocol; `rewards.client.RewardClient` (and verl's reward function
with SIRIUS_REWARD_URL set) is the client.
"""

from __future__ import annotations

from pathlib import Path

import typer

from sirius_train.commands import choices, one_line_errors
from sirius_train.progress import stderr

LOG_LEVEL = choices("LogLevel", ("critical", "error", "warning", "info", "debug", "trace"))  # uvicorn's levels


def register(app: typer.Typer) -> None:
    @app.command("reward-server")
    def reward_server(
        db_root: Path = typer.Option(..., "--db-root", help="folder with <db_id>/<db_id>.sqlite; nothing outside "
                                     "it is ever opened", exists=True, file_okay=False),
        host: str = typer.Option("127.0.0.1", "--host", help="interface to listen on (0.0.0.0 = every one)"),
        port: int = typer.Option(8000, "--port", help="TCP port (0 = any free port; the chosen one is printed)"),
        workers: int = typer.Option(2, "--workers", help="sandboxed worker processes; about one per core"),
        timeout: float = typer.Option(5.0, "--timeout", help="seconds per query, enforced inside SQLite and by "
                                      "killing the worker"),
        max_queue: int = typer.Option(16_384, "--max-queue", help="items accepted and not yet answered; beyond "
                                      "it requests get 429 + Retry-After"),
        max_batch: int = typer.Option(4_096, "--max-batch", help="items in one /v1/score request (more: 413)"),
        max_body_mb: float = typer.Option(32.0, "--max-body-mb", help="request body limit in MiB (more: 413)"),
        token: str = typer.Option(None, "--token", envvar="SIRIUS_REWARD_TOKEN", show_default=False,
                                  help="require 'Authorization: Bearer <token>' on /v1/* (health and metrics "
                                  "stay open)"),
        chunk_size: int = typer.Option(64, "--chunk-size", help="items per message to a worker (advanced)"),
        variants: int = typer.Option(0, "--variants", help="a prediction must also match the gold on K variant "
                                     "databases (rewards.variants; built once, cached on disk)"),
        variants_dir: Path = typer.Option(None, "--variants-dir", help="where variants are cached (default "
                                          "$SIRIUS_VARIANTS_DIR or ~/.cache/sirius-sql/variants)"),
        log_level: LOG_LEVEL = typer.Option(LOG_LEVEL("warning"), "--log-level", help="uvicorn log level"),
    ):
        """Serve the execution reward over HTTP: POST /v1/score, POST /v1/execute, GET /health, GET /metrics."""
        from rich.table import Table

        from rewards.server import serve
        from rewards.service import ServerConfig

        with one_line_errors():
            config = ServerConfig(db_root, workers=workers, timeout_s=timeout, max_queue_items=max_queue,
                                  max_batch_items=max_batch, max_body_bytes=int(max_body_mb * (1 << 20)),
                                  token=token, chunk_size=chunk_size, variants=variants,
                                  variants_dir=None if variants_dir is None else str(variants_dir))
            table = Table(title="reward server", show_header=False)
            for key, value in config.settings().items():
                table.add_row(key, str(value))
            stderr.print(table)
            serve(config, host, port, log_level.value, announce=lambda line: stderr.print(line, soft_wrap=True))
