"""One module per `sirius` command group; each exposes `register(app)`. Heavy imports stay inside commands."""
