"""SQL synthesis as sqlglot trees over any SQLite database: profile, rules + question templates, the
synthesizer, the LLM question writer, mutations for gap filling, and the SQL feature counter."""
