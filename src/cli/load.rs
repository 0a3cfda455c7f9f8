//! Loading a model for any subcommand: path → GGUF → the chosen backend behind `engine::Backend`.
